"""`results pack`: per-sample files compressed losslessly and deterministically; every table reads the same."""

import contextlib
import gzip
import io

import pytest
from helpers.sampled_runs import method_matrices, sampled_run

from atr_grpo.reporting.pack import PackError, pack_runs
from atr_grpo.results import main


def table3_csv(root, out):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert main(["table3", "--runs", str(root), "--out", str(out), "--resamples", "200"]) == 0
    return (out / "table3.csv").read_bytes()


def test_pack_is_lossless_deterministic_and_transparent_to_readers(tmp_path):
    root = tmp_path / "runs"
    for method, extra in (("clip", 0), ("atr", 3)):
        for seed in (0, 1):
            sampled_run(root, "table3", method, seed, method_matrices(extra, seed))
    plain = sorted(root.rglob("*.jsonl"))
    originals = {p: p.read_bytes() for p in plain if p.parent.name.startswith("step_")}
    before = table3_csv(root, tmp_path / "before")
    done = pack_runs(root)
    assert sorted(p for p, _, _ in done) == sorted(originals) and all(after < b for _, b, after in done)
    assert not any(p.exists() for p in originals), "each original is replaced by its .gz"
    for path, data in originals.items():
        assert gzip.decompress(path.with_name(path.name + ".gz").read_bytes()) == data
    assert table3_csv(root, tmp_path / "after") == before, "the tables read the packed files identically"
    first = {p: p.with_name(p.name + ".gz").read_bytes() for p in originals}
    for path, data in originals.items():  # the same file packed again gives the same bytes
        path.write_bytes(data)
        path.with_name(path.name + ".gz").unlink()
    pack_runs(root)
    assert {p: p.with_name(p.name + ".gz").read_bytes() for p in originals} == first
    assert pack_runs(root) == [], "nothing left to pack"


def test_pack_never_replaces_a_different_compressed_file(tmp_path):
    root = tmp_path / "runs"
    sampled_run(root, "table3", "clip", 0, method_matrices(0, 0))
    path = next(root.rglob("step_*/*.jsonl"))
    data = path.read_bytes()
    pack_runs(root)
    path.write_bytes(data.replace(b"true", b"false", 1))  # an edited original beside its packed copy
    with pytest.raises(PackError, match="exists with other content"):
        pack_runs(root)
    assert path.exists() and path.read_bytes() != data, "neither file was changed"


def test_pack_packs_a_final_evaluation_inside_a_run_and_nothing_else_there(tmp_path):
    """A standalone evaluation inside a run folder (it has eval/request.json: a plan's final evaluation) is packed
    with the run's own files; a folder without a request is not an evaluation, and is left alone."""
    from helpers.sampled_runs import counts_matrix, write_sample_file

    from atr_grpo.rundir import layout

    run = sampled_run(tmp_path / "runs", "power3", "clip", 10, method_matrices(0, 0))
    final = layout.sample_file(run / "final_eval", 128, "aime24")
    write_sample_file(final, counts_matrix([3] * 30))
    layout.request_path(run / "final_eval").write_text("{}")
    stray = layout.sample_file(run / "notes", 128, "aime24")
    write_sample_file(stray, counts_matrix([3] * 30))
    data = final.read_bytes()
    packed = [p for p, _, _ in pack_runs(tmp_path / "runs")]
    assert final in packed and stray not in packed and stray.exists()
    assert gzip.decompress(final.with_name(final.name + ".gz").read_bytes()) == data and not final.exists()
