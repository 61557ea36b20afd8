"""The order `make test` hands test files to its workers (tests/conftest.py): longest first, by earlier runs."""

from conftest import longest_files_first


def test_files_go_longest_first_each_in_one_piece_and_a_file_never_timed_before_all():
    nodeids = ["a.py::one", "a.py::two", "b.py::one", "c.py::one", "c.py::two", "d.py::one", "e.py::one"]
    recorded = {"a.py::one": 1.0, "a.py::two": 2.0, "b.py::one": 10.0, "c.py::one": 4.0, "d.py::one": 0.5}
    recorded["e.py::one"] = 3.0  # as long as a.py: the two keep their collection order
    assert longest_files_first(nodeids, recorded) == [
        "c.py::one",  # c.py::two was never timed
        "c.py::two",
        "b.py::one",
        "a.py::one",
        "a.py::two",
        "e.py::one",
        "d.py::one",
    ]
