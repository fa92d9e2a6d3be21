"""What a queued job reads: the config it was submitted with, from a folder only its owner can enter.

A Slurm job may start hours after its submission, and it runs as the user. Whoever can write a
file it reads in between (a group member, under umask 002) decides what it runs: another corpus,
another `init_from`, another output folder. So every command that submits a job holding an
oreline command (`oreline run --executor slurm`, `oreline ablate --executor slurm`, `oreline
launch slurm`) does the same two things:

- **the config is pinned**: the job's command line, inside the script that sbatch got on stdin
  (Slurm keeps its own copy, which nobody else can change), carries the sha256 of the config's
  bytes as they were when the job was submitted (`--config-sha256 HEX`, `pin_args`). The command
  reads the file once, checks the digest of exactly those bytes and parses them
  (`read_pinned`); a file changed in between, replaced, or swapped for a link is refused, and
  the job fails with a message that says what to do, before it reads or writes anything else;
- **job inputs live in a private folder** (`private_folder`): created 0700, made 0700 again when
  it is ours and left wider (by an older oreline or a umask), refused when it is a link, not a
  folder, or owned by someone else. Files in it are written with `write_private` (a new file
  renamed into place, 0600, never through a link left at its name).

The pin is what makes a job run what was submitted: a folder above the private one may still be
writable by others (who could rename it away and put their own in its place), and the digest
catches that too. The private folder keeps the job files unreadable and unchangeable by others
in the first place, so a changed config is an error to look into, not a silent switch.

The Slurm array tasks of `oreline data` and `oreline tokenize` carry their inputs in a jobs file
sealed with a key that travels only in the job's environment (`oreline.executors.slurm`), in a
folder made by the same `private_folder`.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
from pathlib import Path

from oreline.errors import ClusterError, ConfigError
from oreline.io import write_atomic

PIN_OPTION = "--config-sha256"


def digest(data: bytes) -> str:
    """The hex sha256 of a config's bytes, as a job's command line pins it."""
    return hashlib.sha256(data).hexdigest()


def pin_args(data: bytes) -> list[str]:
    """The option that makes a job's command refuse any config but these bytes."""
    return [PIN_OPTION, digest(data)]


def read_pinned(path: Path, sha256: str) -> bytes:
    """The bytes of `path`, read once, when their sha256 is `sha256`; ConfigError otherwise.

    The file is opened without following a link at its name: a config replaced by a link since
    the job was submitted is refused like a changed one."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as exc:
        raise ConfigError(
            f"{path}, the config this job was submitted with, cannot be read ({exc.strerror}; a link "
            "left in its place is not followed)",
            "submit the job again (the command that submitted it writes the config anew)",
        ) from None
    with os.fdopen(fd, "rb") as f:
        data = f.read()
    found = digest(data)
    if found != sha256.strip().lower():
        raise ConfigError(
            f"{path} changed since this job was submitted (sha256 {found[:16]}…, the job was submitted "
            f"with {sha256.strip()[:16]}…): a queued job runs only the config it was submitted with, "
            "so it stopped before reading or writing anything else",
            "check who can write to that folder; to run the config as it is now, submit the jobs again "
            "(`oreline run --executor slurm`, `oreline ablate --executor slurm`, `oreline launch slurm`)",
        )
    return data


def private_folder(path: Path) -> Path:
    """`path` as a folder only its owner (this user) can read, write or enter: created 0700, or
    made 0700 when it is ours; ClusterError when someone else owns it or it is a link (a link is
    not followed: lstat sees the link itself)."""
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        what = (
            "a link"
            if stat.S_ISLNK(st.st_mode)
            else "not a folder"
            if not stat.S_ISDIR(st.st_mode)
            else "owned by another user"
        )
        raise ClusterError(
            f"{path} is {what} (not a folder of yours): what oreline keeps there (job files, a Ray "
            "session) could be read or replaced by someone else",
            f"remove {path} (or choose another output folder) and run the command again",
        )
    if stat.S_IMODE(st.st_mode) != 0o700:
        # ours, left open by an older oreline or the umask: nothing in it is trusted as it stands
        # (a config is pinned, a jobs file sealed), so closing it is enough
        os.chmod(path, 0o700)
    return path


def write_private(path: Path, data: bytes) -> None:
    """Write `data` to `path` through oreline's one no-follow writer (`oreline.io.write_atomic`),
    then readable by us only."""
    write_atomic(path, data)
    os.chmod(path, 0o600, follow_symlinks=False)


def submitted_config(folder: Path, name: str, text: str) -> tuple[Path, list[str]]:
    """Write a job's config `text` as `folder/name` (the folder made private first) and return its
    path and the options that pin the job's command to it (`pin_args`)."""
    data = text.encode("utf-8")
    path = private_folder(folder) / name
    write_private(path, data)
    return path, pin_args(data)
