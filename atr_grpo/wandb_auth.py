"""Whether W&B has an API key without asking for one, checked locally as the installed wandb looks for it.

Used by `logger.mode=auto` (online only with a key) and by the W&B report (saving needs a key). wandb 0.31 logs in
to https://api.forge.coreweave.com by default (WANDB_BASE_URL or `wandb login --host` change it), and `wandb login`
writes the key to ~/.netrc under that host: a check for `api.wandb.ai` alone would miss a logged-in user.
"""

from __future__ import annotations

import os


def api_key_available() -> bool:
    """WANDB_API_KEY is set, or the .netrc file (NETRC, else ~/.netrc) has a key for the host wandb logs in to.

    Reads no network. A .netrc entry wandb finds malformed raises wandb's AuthenticationError, which names it.
    """
    if os.environ.get("WANDB_API_KEY"):
        return True
    from wandb.sdk import wandb_setup
    from wandb.sdk.lib import wbauth

    return wbauth.read_netrc_auth(host=wandb_setup.singleton().settings.base_url) is not None
