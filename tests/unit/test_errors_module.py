"""rlhfkit.errors: how a library's or the filesystem's exception is phrased in a one-line message."""

import errno

from rlhfkit.errors import one_line, os_error_fix


def test_one_line():
    assert one_line(OSError(errno.ENOSPC, "No space left on device", "/x")) == "No space left on device"
    assert one_line(ValueError("first\n\n  second  \nthird")) == "ValueError: first second third"
    assert one_line(KeyError("k")) == "KeyError: 'k'"
    assert one_line(RuntimeError()) == "RuntimeError"
    long = one_line(ValueError("x" * 500), limit=50)
    assert len(long) == 50 and long.endswith("...")


def test_os_error_fix_by_errno():
    assert os_error_fix(OSError(errno.ENOSPC, "")) == "free disk space"
    assert os_error_fix(PermissionError(errno.EACCES, "")) == "choose a place you may write to (or fix its permissions)"
    assert os_error_fix(NotADirectoryError(errno.ENOTDIR, "")).startswith("a part of the path is a file")
    assert os_error_fix(OSError("no errno"), "the default") == "the default"
    # a Rust library's error type names the errno only in its text
    assert os_error_fix(Exception("I/O error: Read-only file system (os error 30)")) == (
        "choose a place on a writable file system")


def test_first_line_is_the_first_non_blank_line_or_says_there_is_none():
    from rlhfkit.errors import first_line

    class Unprintable(Exception):
        def __str__(self):
            raise RuntimeError("no")

    assert first_line(LookupError("\n\n  Resource words not found.\n  more\n")) == "Resource words not found."
    assert first_line(ValueError("x" * 400), limit=5) == "xxxxx"
    assert first_line(ValueError()) == "(no message)"
    assert first_line(ValueError("  \n ")) == "(no message)"
    assert first_line(Unprintable()) == "(no message)"
