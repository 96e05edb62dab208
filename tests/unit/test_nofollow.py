"""sandbox/nofollow.py: the one write grading makes into a tree the agent built. Each test plants one escape."""

import os
import stat

import pytest

from flywheel.sandbox.nofollow import inside, write_inside


@pytest.fixture
def tree(tmp_path):
    root, outside = tmp_path / "ws", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "victim.py").write_text("keep me\n")
    return root, outside


@pytest.mark.parametrize("rel", ["../escape.py", "a/../../escape.py", "ABSOLUTE", ""])
def test_paths_that_leave_the_root_lexically_are_refused(tree, rel):
    root, outside = tree
    rel = str(outside / "victim.py") if rel == "ABSOLUTE" else rel  # never a system file: this runs as root
    with pytest.raises(ValueError, match="inside the workspace"):
        write_inside(root, rel, "x")
    with pytest.raises(ValueError, match="inside the workspace"):
        inside(root, rel)
    assert not (root.parent / "escape.py").exists() and (outside / "victim.py").read_text() == "keep me\n"


def test_a_linked_directory_on_the_way_is_replaced_not_followed(tree):
    root, outside = tree
    (root / "tests").symlink_to(outside, target_is_directory=True)
    p = write_inside(root, "tests/victim.py", "hidden test\n")
    assert (outside / "victim.py").read_text() == "keep me\n" and sorted(os.listdir(outside)) == ["victim.py"]
    assert (root / "tests").is_dir() and not (root / "tests").is_symlink() and p.read_text() == "hidden test\n"


def test_a_linked_file_is_replaced_not_written_through(tree):
    root, outside = tree
    (root / "test_x.py").symlink_to(outside / "victim.py")
    write_inside(root, "test_x.py", b"restored\n")
    assert (outside / "victim.py").read_text() == "keep me\n"
    assert not (root / "test_x.py").is_symlink() and (root / "test_x.py").read_bytes() == b"restored\n"


def test_a_dangling_link_is_not_created_through(tree):
    """A link to a name that does not exist yet: opening it with O_CREAT alone would create the target."""
    root, outside = tree
    (root / "conftest.py").symlink_to(outside / "new.py")
    write_inside(root, "conftest.py", "x = 1\n")
    assert not (outside / "new.py").exists() and (root / "conftest.py").read_text() == "x = 1\n"


def test_a_file_or_directory_in_the_way_is_replaced(tree):
    root, _ = tree
    (root / "pkg").write_text("a file where a directory must be\n")
    (root / "tests" / "test_a.py").mkdir(parents=True)  # a directory where the file must be
    write_inside(root, "pkg/mod.py", "m = 1\n")
    write_inside(root, "tests/test_a.py", "t = 1\n")
    assert (root / "pkg" / "mod.py").read_text() == "m = 1\n" and (root / "tests" / "test_a.py").is_file()


def test_mode_bits_are_set_exactly(tree):
    root, _ = tree
    old = os.umask(0o077)
    try:
        write_inside(root, "run.sh", "#!/bin/sh\n", mode=0o755)
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(root / "run.sh").st_mode) == 0o755
