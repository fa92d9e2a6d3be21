"""Values that go into Slurm scripts and sbatch command lines: checked, then quoted.

A value from a config file, the command line or a path reaches a script that bash runs, or an
`#SBATCH` line that sbatch parses with its own tokenizer. A newline turns the value into a line
of its own (`partition = "debug\\ntouch X"`), a space into another sbatch option. So:

- `shell_word(value, key)`: a word for bash, quoted with `shlex.quote`; a control character is
  refused (quoting would keep bash safe, but a path or name holding one is a mistake or an attack);
- `directive(option, value, key)`: an `#SBATCH --option=value` line; the value must be a plain
  token (no whitespace, quote, backslash, '#' or control character), anything else is refused, as
  sbatch would split it or read an option of its own in it;
- `job_name(*parts)`: a job name from free text (a run's name may hold spaces or `/`), with every
  other character replaced by `_` (the name is a label only);
- `check_time`, `check_partition`, `check_sbatch_arg`: the validators of data.slurm in
  `oreline.config`, so a bad value is refused when the config is loaded, with its key.

Every refusal names the key and what to write instead.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from oreline.errors import ConfigError

# what sbatch reads as one value of an #SBATCH line: no whitespace, quote, backslash, '#' or control
TOKEN = re.compile(r"[^\s'\"\\#\x00-\x1f\x7f]+")
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")  # C0, DEL, C1, line separators
# sbatch --time: minutes, minutes:seconds, hours:minutes:seconds, days-hours[:minutes[:seconds]]
TIME = re.compile(r"(\d+-\d+(:\d+){0,2}|\d+(:\d+){0,2}|UNLIMITED|INFINITE)")
PARTITION = re.compile(r"[A-Za-z0-9_.-]+(,[A-Za-z0-9_.-]+)*")
OPTION = re.compile(r"--[a-z][a-z0-9-]*(=[A-Za-z0-9_.,:/%@+=-]+)?")
# options that change what runs, as whom, with which environment, or where its output goes: oreline
# sets these itself, and a config that names them could run code or overwrite files
RESERVED = frozenset(
    {
        "--array",
        "--chdir",
        "--error",
        "--export",
        "--export-file",
        "--get-user-env",
        "--gid",
        "--input",
        "--output",
        "--parsable",
        "--uid",
        "--wrap",
        "--dependency",
        "--job-name",
    }
)


def shell_word(value: object, key: str) -> str:
    """`value` quoted as one bash word; ConfigError when it holds a control character."""
    text = str(value)
    if CONTROL.search(text):
        raise ConfigError(
            f"{key} = {text!r} holds a control character (a newline would become a line of the script)",
            f"write {key} without control characters",
        )
    import shlex

    return shlex.quote(text)


def directive(option: str, value: object, key: str) -> str:
    """The line `#SBATCH --option=value`; ConfigError when value is not a plain token."""
    text = str(value)
    if not TOKEN.fullmatch(text):
        raise ConfigError(
            f"{key} = {text!r} cannot be an #SBATCH {option} value: sbatch splits a value at whitespace "
            "and reads quotes, backslashes and '#' itself",
            f"write {key} without spaces, quotes, '#' or control characters (a path: move it to a folder "
            "whose name has none)",
        )
    return f"#SBATCH {option}={text}"


def job_script(
    slurm: Any,
    *,
    name: str,
    name_key: str,
    log: str,
    log_key: str,
    cpus: int,
    cancels: str,
    command: list[str],
    command_key: str,
) -> str:
    """The script of one job that runs an oreline command (a stage of `oreline run --executor slurm`,
    an arm or the report of `oreline ablate --executor slurm`): its #SBATCH lines (job `name`, the
    `log` file, `cpus`, and data.slurm's time limit, partition and sbatch_args, `slurm`) and `exec`
    of `command`. Every value is checked and refused with the key it came from (`name_key`,
    `log_key`, `command_key`); `cancels` says what --kill-on-invalid-dep does to the jobs after it."""
    lines = [
        "#!/usr/bin/env bash",
        directive("--job-name", name, name_key),
        directive("--output", log, log_key),
        directive("--cpus-per-task", int(cpus), "data.slurm.stage_cpus"),
        directive("--time", slurm.stage_time_limit, "data.slurm.stage_time_limit"),
        directive("--chdir", Path.cwd(), "the current folder"),
        f"#SBATCH --kill-on-invalid-dep=yes   # {cancels}",
    ]
    if slurm.partition:
        lines.append(directive("--partition", slurm.partition, "data.slurm.partition"))
    for a in slurm.sbatch_args:
        option, _, value = a.partition("=")
        lines.append(directive(option, value, "data.slurm.sbatch_args") if value else f"#SBATCH {option}")
    words = " ".join(shell_word(c, command_key) for c in command)
    return "\n".join([*lines, "", f"exec {words}", ""])


def checked(check, value: str, key: str) -> str:
    """`check(value)` (one of the validators below), its refusal as a ConfigError naming `key`."""
    try:
        return check(value)
    except ValueError as exc:
        raise ConfigError(f"{key}: {exc}", f"fix {key}") from None


def write_script(path: Path, text: str) -> None:
    """Write a script for the user to read and submit: atomically (a new file renamed over `path`,
    never through a link someone left there), executable, writable by its owner only."""
    import os
    import secrets

    from oreline.io import refuse_planted

    refuse_planted(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o755)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(tmp, 0o755)
    tmp.replace(path)


def job_name(*parts: object) -> str:
    """A Slurm job name from free text: parts joined by '-', anything but a plain token char as '_'."""
    return re.sub(r"[^A-Za-z0-9_.+-]", "_", "-".join(str(p) for p in parts if str(p)))[:200] or "oreline"


# The validators of data.slurm (oreline.config): pydantic names the key in front of the message.


def check_time(value: str) -> str:
    if not TIME.fullmatch(value):
        raise ValueError(
            f"{value!r} is not a Slurm time limit; write minutes, H:MM:SS or D-HH:MM:SS (e.g. '2:00:00')"
        )
    return value


def check_partition(value: str) -> str:
    if value and not PARTITION.fullmatch(value):
        raise ValueError(
            f"{value!r} is not a partition name; write a name `sinfo -s` lists (letters, digits, _.-; "
            "several joined by ','), or '' for the cluster's default"
        )
    return value


def check_sbatch_arg(value: str) -> str:
    if not OPTION.fullmatch(value):
        raise ValueError(
            f"{value!r} is not one sbatch option; write each item as '--name' or '--name=value' "
            "(a long option; the value a plain token: no spaces, quotes or control characters)"
        )
    name = value.split("=", 1)[0]
    if name in RESERVED:
        raise ValueError(
            f"{value!r}: oreline sets {name} itself (it decides what runs, with which environment, "
            "or where the output goes); leave it out of data.slurm.sbatch_args"
        )
    return value
