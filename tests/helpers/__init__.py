"""What the tests share and are not tests themselves: modules that test files import (`from helpers.x import ...`)
and the scripts that tests start as processes. pytest collects nothing here (no `test_*.py`), and tests/ is on
sys.path because tests/conftest.py is (pytest's default prepend import mode). A test module never imports another
test module: what two of them share lives here."""
