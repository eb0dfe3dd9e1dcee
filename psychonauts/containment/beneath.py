"""Acting on a tree an agent can change meanwhile, through descriptors only.

A sandboxed command of the same quantum can swap any folder of its worktree for a link while the
runtime (root, outside the sandbox) works on it. A path string resolved again after a check may
then lead anywhere on the machine; a descriptor opened step by step with O_NOFOLLOW cannot.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# How deep a tree is followed (each level holds a descriptor open).
DEPTH = 256


def tree_chown(root: Path, uid: int, *, skip_top: frozenset[str] = frozenset()) -> None:
    """`root` and everything below it become `uid`'s (and its group's), each entry changed
    through a descriptor of its own folder: a folder swapped for a link is not entered, a link is
    changed itself. `skip_top`: names left alone in `root` itself (its `.git`). A file with
    several names that `uid` does not own (a hard link: it may be a file of anyone's elsewhere)
    is left alone."""
    fd = os.open(root, _DIR_FLAGS)
    try:
        os.fchown(fd, uid, uid)
        _chown_below(fd, uid, skip_top, DEPTH)
    finally:
        os.close(fd)


def _chown_below(dir_fd: int, uid: int, skip: frozenset[str], depth: int) -> None:
    with os.scandir(dir_fd) as entries:
        listed = [(e.name, e.is_dir(follow_symlinks=False)) for e in entries if e.name not in skip]
    for name, is_dir in listed:
        if not is_dir:
            _chown_entry(dir_fd, name, uid)
            continue
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno in (errno.ENOTDIR, errno.ELOOP):
                _chown_entry(dir_fd, name, uid)  # swapped for a link or a file since listed
            continue
        try:
            os.fchown(fd, uid, uid)
            if depth > 0:
                _chown_below(fd, uid, frozenset(), depth - 1)
        finally:
            os.close(fd)


def _chown_entry(dir_fd: int, name: str, uid: int) -> None:
    """One entry that is not a folder, by its name in the folder held open, never followed (a
    link is changed itself)."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if st.st_nlink > 1 and st.st_uid != uid and stat.S_ISREG(st.st_mode):
            return
        os.chown(name, uid, uid, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        pass  # gone meanwhile
