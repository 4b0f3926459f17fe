"""What an agent's tool call was doing, from its tool's name and arguments alone: a pure
function, so the report can sort every agent's calls the same way.

`classify(tool, arguments)` gives the call's *category* and its *flags*.

Categories (the report's shares of wall time; waiting on the model comes from model calls):

| tool | category |
| --- | --- |
| read_file, list_files (built-in); Read, Glob, Grep, LS, NotebookRead, WebFetch, WebSearch (Claude Code); list_dir, grep_files, view_image (Codex) | reading and exploring |
| write_file, edit_file (built-in); Edit, MultiEdit, Write, NotebookEdit (Claude Code); apply_patch (Codex) | editing |
| run_python (built-in) | evaluating when its path or arguments name eval or score, else training or running scripts |
| write_stdin (Codex: input to a command already running, and the wait for its output) | training or running scripts |
| bash (built-in), shell (baseline, human; Codex's older shell), Bash (Claude Code), exec_command (Codex), and any other tool with a `command` or `cmd` argument | by its command line (below) |
| submit, and anything else | other |
| command (the command agent's whole program: Claude Code, Codex, yours) | not a category: its time is its model calls' and tool calls' |

A command line is cut into its simple commands (at `;`, `&&`, `||`, `|`, `&` and new lines;
a here-document's body is not a command) and takes the most effortful class of any of them:

1. evaluating: a simple command that runs a program (as in 2) and names eval or score
   (`eval.py`, `--eval`, `evaluate`, `score.py`, `scoring`, `lm_eval`);
2. training or running scripts: python, a shell running a script, `./script`, torchrun,
   accelerate, deepspeed, make, pytest and the like; sleep and wait (waiting on work started before);
3. editing: sed -i, tee, cp, mv, rm, mkdir, touch, patch, git apply, or output redirected
   into a file (`cat > train.py <<EOF`);
4. reading and exploring: ls, cat, head, tail, grep, find, wc, diff, nvidia-smi, git status...;
5. other: installing packages (pip install...), and anything not named here.

Flags say what a call tried to reach that the sandbox blocks (integrity notes: from the text of
its command or the paths it names, not from whether it got there):

- hidden paths: a `hidden/` folder (the assets' hidden data), `/root` or `/home/` (home
  folders), the harness's files (`mlrb`, `mlruns`, `mlflow.db`); a path into the workspace or
  the task's public data (a `workspace` or `public` folder, no `..`) is not flagged;
- other processes' environments: `/proc/<pid>/environ` (not `/proc/self`), `ps e`;
- the network: curl, wget, pip install, git clone (fetch, pull, push), apt or conda or npm
  install, hf download, an `http(s)://` URL, a socket or `urlopen` in a command, and Claude
  Code's WebFetch and WebSearch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

# Categories, in order of effort: a command line with several takes the first of its own.
EVALUATING = "evaluating"
RUNNING = "running"
EDITING = "editing"
READING = "reading"
OTHER = "other"
MODEL = "model"  # waiting on the model: model calls' latency (not a tool's category)
CATEGORIES = (MODEL, READING, EDITING, RUNNING, EVALUATING, OTHER)
LABELS = {
    MODEL: "waiting on the model",
    READING: "reading and exploring",
    EDITING: "editing",
    RUNNING: "training or running scripts",
    EVALUATING: "evaluating",
    OTHER: "other",
}
EFFORT = (EVALUATING, RUNNING, EDITING, READING, OTHER)

HIDDEN, PROCESSES, NETWORK = "hidden", "processes", "network"
FLAGS = (HIDDEN, PROCESSES, NETWORK)
FLAG_LABELS = {HIDDEN: "hidden paths", PROCESSES: "other processes' environments", NETWORK: "network"}

# The command agent's one tool call: the whole outside program (mlrb/agents/command.py). What it
# did is in its model and tool calls, which the harness records beside it.
CONTAINER = "command"

# Tools whose command line is in an argument: tool -> the argument.
SHELLS = {"bash": "command", "shell": "command", "Bash": "command", "exec_command": "cmd", "local_shell": "command"}
# Tools of one category whatever they are asked, and the arguments that name what they touch.
FIXED: dict[str, tuple[str, tuple[str, ...]]] = {
    "read_file": (READING, ("path",)),
    "list_files": (READING, ("path",)),
    "Read": (READING, ("file_path",)),
    "Glob": (READING, ("pattern", "path")),
    "Grep": (READING, ("path",)),
    "LS": (READING, ("path",)),
    "NotebookRead": (READING, ("notebook_path",)),
    "WebFetch": (READING, ("url",)),
    "WebSearch": (READING, ()),
    "list_dir": (READING, ("dir_path", "path")),
    "grep_files": (READING, ("path",)),
    "view_image": (READING, ("path",)),
    "write_file": (EDITING, ("path",)),
    "edit_file": (EDITING, ("path",)),
    "Edit": (EDITING, ("file_path",)),
    "MultiEdit": (EDITING, ("file_path",)),
    "Write": (EDITING, ("file_path",)),
    "NotebookEdit": (EDITING, ("notebook_path",)),
    "apply_patch": (EDITING, ()),  # its paths are in the patch's headers
    "write_stdin": (RUNNING, ()),
    "submit": (OTHER, ()),
}
WEB_TOOLS = {"WebFetch", "WebSearch"}  # Claude Code's own network tools: flagged whatever they ask

# ---- command lines ------------------------------------------------------------------------

# Words before the program that do not change what it is (the shell's `if ( python ... )` included).
WRAPPERS = {
    "sudo",
    "nohup",
    "time",
    "env",
    "nice",
    "stdbuf",
    "exec",
    "command",
    "builtin",
    "srun",
    "ionice",
    "xvfb-run",
    "if",
    "elif",
    "while",
    "until",
    "then",
    "do",
    "else",
    "!",
    "{",
    "(",
}
# Words that take the next one as their value (timeout 600 python ...).
WRAPPERS_WITH_VALUE = {"timeout"}
NEUTRAL = {
    "export",
    "set",
    "source",
    ".",
    "true",
    "false",
    "unset",
    "alias",
    "fi",
    "done",
    "}",
    ")",
    "for",
    "case",
    "esac",
    "ulimit",
    "trap",
    "umask",
    "exit",
    "return",
}
RUNNERS = {
    "torchrun",
    "accelerate",
    "deepspeed",
    "make",
    "pytest",
    "lm_eval",
    "lm-eval",
    "julia",
    "Rscript",
    "node",
    "java",
    "cargo",
    "go",
    "sleep",
    "wait",
    "jupyter",
    "papermill",
    "nvcc",
    "gcc",
    "g++",
    "lean",
    "lake",
}
SHELL_PROGRAMS = {"bash", "sh", "zsh", "dash"}
INSTALLERS = {"pip", "pip3", "uv", "apt", "apt-get", "conda", "mamba", "npm", "yarn", "poetry", "brew"}
EDITORS = {
    "tee",
    "cp",
    "mv",
    "rm",
    "rmdir",
    "mkdir",
    "touch",
    "patch",
    "apply_patch",
    "ln",
    "chmod",
    "truncate",
    "dd",
    "install",
    "rsync",
    "unzip",
    "tar",
    "gzip",
    "gunzip",
    "vim",
    "vi",
    "nano",
    "emacs",
}
READERS = {
    "cd",
    "pushd",
    "popd",
    "ls",
    "cat",
    "head",
    "tail",
    "less",
    "more",
    "grep",
    "egrep",
    "fgrep",
    "rg",
    "ag",
    "find",
    "fd",
    "tree",
    "wc",
    "du",
    "df",
    "file",
    "stat",
    "pwd",
    "diff",
    "cmp",
    "sort",
    "uniq",
    "cut",
    "awk",
    "sed",
    "jq",
    "which",
    "whereis",
    "type",
    "echo",
    "printf",
    "nvidia-smi",
    "free",
    "top",
    "htop",
    "ps",
    "printenv",
    "nproc",
    "lscpu",
    "uname",
    "whoami",
    "id",
    "date",
    "xxd",
    "hexdump",
    "od",
    "strings",
    "md5sum",
    "sha256sum",
    "zcat",
    "base64",
    "tr",
    "column",
    "realpath",
    "readlink",
    "basename",
    "dirname",
    "test",
    "[",
    "[[",
    "git",
    "nl",
    "view",
    "locate",
    "sqlite3",
    "h5ls",
    "hostname",
    "uptime",
    "lsof",
    "vmstat",
    "iostat",
    "watch",
}
GIT_FETCHES = {"clone", "fetch", "pull", "push", "ls-remote"}  # setting up (and flagged: the network)
GIT_EDITS = {"apply", "am", "commit", "checkout", "restore", "reset", "stash", "mv", "rm", "merge", "revert"}

HEREDOC = re.compile(r"(?<!<)<<(?!<)-?\s*(['\"]?)(\w+)\1[^\n]*\n(.*?)(?:\n\2[ \t]*(?=\n|$)|$)", re.DOTALL)
SEPARATORS = re.compile(r"&&|\|\||[;|\n]|&(?![>&\d])")
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
REDIRECT_TO_FILE = re.compile(r"(?<![<&\d])\d?>>?\s*(?!&|/dev/)['\"]?[\w./$~-]")
# eval or score as a word of its own within a name (eval.py, run_eval.sh, --do_eval, score_model.py), not retrieval
NAMES_EVALUATION = re.compile(
    r"(?<![a-z])eval(?![a-z])|evaluat|(?<![a-z])scor(?:e|es|er|ers|ing)(?![a-z])", re.IGNORECASE
)


def without_heredocs(command: str) -> tuple[str, str]:
    """(the command line without its here-documents' bodies, the bodies that a program reads as
    its input rather than ones written into a file: `python - <<EOF` runs its body)."""
    run_bodies: list[str] = []

    def cut(match: re.Match) -> str:
        header = command[command.rfind("\n", 0, match.start()) + 1 : match.start()]
        if not REDIRECT_TO_FILE.search(header):
            run_bodies.append(match.group(3))
        return "<<" + match.group(2) + "\n"

    return HEREDOC.sub(cut, command), "\n".join(run_bodies)


def words_of(segment: str) -> list[str]:
    return [w.strip("'\"`") for w in segment.replace("(", " ( ").replace(")", " ) ").split()]


def program_and_args(segment: str) -> tuple[str, list[str]]:
    """The program a simple command runs ("" when none), past variable assignments and wrappers."""
    words = words_of(segment)
    i = 0
    while i < len(words):
        word = words[i]
        if ASSIGNMENT.match(word) or word in WRAPPERS or (word.startswith("-") and i > 0 and words[i - 1] == "env"):
            i += 1
        elif word in WRAPPERS_WITH_VALUE:
            i += 2
        else:
            break
    if i >= len(words):
        return "", []
    return words[i].rsplit("/", 1)[-1] if not words[i].startswith("./") else words[i], words[i + 1 :]


def segment_category(segment: str) -> str | None:
    """The class of one simple command; None for one that does nothing by itself (cd, export)."""
    program, args = program_and_args(segment)
    if not program or program in NEUTRAL:
        return None
    if program.startswith("python") or (program in ("uv", "poetry", "pipenv") and args[:1] == ["run"]):
        if "pip" in args[:3] and any(a in ("install", "download", "uninstall") for a in args):
            return OTHER  # python -m pip install: setting up
        if args[:1] in (["--version"], ["-V"]):
            return READING
        return RUNNING
    if program in SHELL_PROGRAMS:
        option = next(
            (i for i, a in enumerate(args) if a.startswith("-") and not a.startswith("--") and "c" in a), None
        )
        if option is not None:  # bash -c '...': what it runs
            return most_effortful(categories_of(" ".join(args[option + 1 :])))
        return RUNNING if any(not a.startswith("-") for a in args) else None  # bash train.sh
    if program.startswith("./") or program in RUNNERS:
        return RUNNING
    if program in INSTALLERS:
        return OTHER
    if program == "git":
        if args[:1] and args[0] in GIT_FETCHES:
            return OTHER
        return EDITING if args[:1] and args[0] in GIT_EDITS else READING
    if program in EDITORS or (program == "sed" and any(a.startswith("-i") or a == "--in-place" for a in args)):
        return EDITING
    if REDIRECT_TO_FILE.search(segment):
        return EDITING
    if program in READERS:
        return READING
    return OTHER


def segments(command: str) -> list[str]:
    return [s.strip() for s in SEPARATORS.split(command) if s.strip()]


def categories_of(text: str) -> set[str]:
    """The classes of a line's simple commands; one that runs a program and names eval or score evaluates."""
    found = set()
    for segment in segments(text):
        category = segment_category(segment)
        if category == RUNNING and NAMES_EVALUATION.search(segment):
            category = EVALUATING
        if category is not None:
            found.add(category)
    return found


def most_effortful(found: set[str]) -> str | None:
    return next((category for category in EFFORT if category in found), None)


def command_category(command: str) -> str:
    """The most effortful class of a command line's simple commands (module docstring)."""
    text, _ = without_heredocs(command)
    return most_effortful(categories_of(text)) or OTHER


# ---- flags ----------------------------------------------------------------------------------

# Paths into the agent's own workspace or the task's public data: never flagged (an unconfined
# run names them by their full host path, under a home folder or the cache).
ALLOWED_PATH = re.compile(r"[^\s'\"=:]*/(?:workspace|public)(?![\w.-])(?:/[^\s'\"]*)?")
HIDDEN_PATTERNS = (
    re.compile(r"/hidden(?![\w.-])|(?<![\w.-])hidden/"),  # the assets' hidden folder
    re.compile(r"(?<![\w~$-])/root(?![\w.-])|(?<![\w.-])/home/"),  # home folders (../../root too)
    re.compile(r"\bmlrb\b|\bmlruns\b|mlflow\.db"),  # the harness's files (lower case: $MLRB_DATA is the agent's)
)
PROCESS_PATTERNS = (
    re.compile(r"/proc/(?!self/|thread-self/)[^/\s]+/environ"),
    re.compile(r"\bps\s+(?:[a-zA-Z]*e[a-zA-Z]*)(?:\s|$)"),  # BSD-style `ps e`, `ps auxe`: environments shown
)
NETWORK_PATTERNS = (
    re.compile(r"(?<![\w.-])(?:curl|wget|ssh|scp|sftp|telnet)(?![\w.-])"),  # commands (not ~/.ssh)
    re.compile(r"\bpip3?\s+(?:install|download)\b|\b(?:apt|apt-get|conda|mamba|npm)\s+(?:install|update)\b"),
    re.compile(r"\bgit\s+(?:clone|fetch|pull|push|ls-remote)\b|\b(?:hf|huggingface-cli)\s+download\b"),
    re.compile(r"\bhttps?://|\bsocket\.(?:socket|create_connection)\b|\burlopen\b|\brequests\.(?:get|post)\b"),
)


def flags_of(text: str) -> frozenset[str]:
    """The flags a command line or a path earns (module docstring)."""
    found = set()
    if any(p.search(text) for p in NETWORK_PATTERNS):
        found.add(NETWORK)
    if any(p.search(text) for p in PROCESS_PATTERNS):
        found.add(PROCESSES)
    outside = ALLOWED_PATH.sub(lambda m: " " if ".." not in m.group(0) else m.group(0), text)
    if any(p.search(outside) for p in HIDDEN_PATTERNS):
        found.add(HIDDEN)
    return frozenset(found)


# ---- a tool call ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Activity:
    category: str | None  # None: the command agent's program as a whole (CONTAINER)
    flags: frozenset[str]
    text: str  # what was classified and flagged: its command line, or the paths it names


def command_of(value: Any) -> str:
    """A command argument as one line: a string, or a list of words (Codex's ["bash", "-lc", "..."])."""
    if isinstance(value, list):
        words = [str(w) for w in value]
        if len(words) >= 3 and words[0].rsplit("/", 1)[-1] in SHELL_PROGRAMS and words[1].startswith("-"):
            return words[2]
        return " ".join(words)
    return value if isinstance(value, str) else ""


PATCH_PATHS = re.compile(r"^\*\*\* (?:Add File|Update File|Delete File|Move to): (.+)$", re.MULTILINE)


def classify(tool: str, arguments: dict[str, Any] | None) -> Activity:
    """The category and flags of one tool call (module docstring's table)."""
    args = arguments if isinstance(arguments, dict) else {}
    if tool == CONTAINER:
        return Activity(None, frozenset(), "")
    if tool in FIXED:
        category, path_args = FIXED[tool]
        if tool == "apply_patch":
            patch = " ".join(v for v in args.values() if isinstance(v, str))
            text = " ".join(PATCH_PATHS.findall(patch))
        else:
            text = " ".join(str(args[a]) for a in path_args if isinstance(args.get(a), str))
        flags = flags_of(text) | ({NETWORK} if tool in WEB_TOOLS else set())
        return Activity(category, frozenset(flags), text)
    if tool == "run_python":
        text = f"python {args.get('path', '')} {args.get('args', '')}".strip()
        return Activity(EVALUATING if NAMES_EVALUATION.search(text) else RUNNING, flags_of(text), text)
    key = SHELLS.get(tool) or next((k for k in ("command", "cmd") if k in args), None)
    if key is not None:
        command = command_of(args.get(key))
        header, run_bodies = without_heredocs(command)
        return Activity(command_category(command), flags_of(header + "\n" + run_bodies), command)
    return Activity(OTHER, frozenset(), "")
