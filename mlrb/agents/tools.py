"""The tools an LLM agent acts through, defined once for every provider.

Each tool has a name, a description and a JSON schema for its arguments (what
the model sees), and a function that does the work through the run's sandbox
and returns the text the model reads back. Paths are relative to the workspace,
which is the working directory of every command.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mlrb.sandbox.base import ExecResult, Sandbox


class ToolError(Exception):
    """The model used a tool wrongly (bad arguments, text not found...): it is told, the run goes on."""


@dataclass
class ToolEnv:
    sandbox: Sandbox
    # Seconds of wall time the budget has left: no command may run longer.
    remaining_s: Callable[[], float]
    default_timeout_s: float
    output_chars: int


@dataclass
class ToolOutput:
    text: str
    is_error: bool = False
    exit_code: int | None = None


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]  # JSON schema of the arguments object
    run: Callable[[ToolEnv, dict[str, Any]], ToolOutput]


SUBMIT = "submit"


def truncate(text: str, limit: int) -> str:
    """Keep the head and the tail (errors are usually at the end), with a visible marker between."""
    if len(text) <= limit:
        return text
    head = limit // 2
    tail = limit - head
    omitted = len(text) - head - tail
    return f"{text[:head]}\n[... {omitted} characters truncated ...]\n{text[len(text) - tail :]}"


def schema(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


def string_arg(args: dict[str, Any], name: str, default: str | None = None) -> str:
    value = args.get(name, default)
    if value is None:
        raise ToolError(f"missing argument '{name}'")
    if not isinstance(value, str):
        raise ToolError(f"argument '{name}' must be a string, got {type(value).__name__}")
    return value


def timeout_arg(env: ToolEnv, args: dict[str, Any]) -> float:
    requested = args.get("timeout_s")
    if requested is not None and (not isinstance(requested, (int, float)) or requested <= 0):
        raise ToolError("argument 'timeout_s' must be a positive number of seconds")
    return min(float(requested or env.default_timeout_s), env.remaining_s())


def final_frames(text: str) -> str:
    """Keep only what a terminal would end up showing of lines redrawn with carriage
    returns (progress bars): their every frame would fill the model's context."""
    return "\n".join(line.rstrip("\r").rsplit("\r", 1)[-1] for line in text.split("\n"))


def describe_exec(result: ExecResult, timeout_s: float, limit: int) -> ToolOutput:
    parts = [f"exit code {result.exit_code} ({result.duration_s:.1f} s)"]
    if result.timed_out:
        parts[0] = f"timed out after {timeout_s:.0f} s; the command was killed"
    if result.stdout:
        parts.append("stdout:\n" + final_frames(result.stdout))
    if result.stderr:
        parts.append("stderr:\n" + final_frames(result.stderr))
    if not result.stdout and not result.stderr:
        parts.append("(no output)")
    failed = result.timed_out or result.exit_code != 0
    return ToolOutput(truncate("\n".join(parts), limit), is_error=failed, exit_code=result.exit_code)


def run_command(env: ToolEnv, command: str, args: dict[str, Any]) -> ToolOutput:
    timeout_s = timeout_arg(env, args)
    if timeout_s <= 0:
        raise ToolError("not run: no wall time left")
    return describe_exec(env.sandbox.exec(command, timeout_s), timeout_s, env.output_chars)


def shell(env: ToolEnv, args: dict[str, Any]) -> ToolOutput:
    return run_command(env, string_arg(args, "command"), args)


def run_python(env: ToolEnv, args: dict[str, Any]) -> ToolOutput:
    path = string_arg(args, "path")
    # Arguments go through the shell, so "$MLRB_DATA" and quoting work as on a command line.
    return run_command(env, f"python {shlex.quote(path)} {string_arg(args, 'args', '')}".rstrip(), args)


def read_file(env: ToolEnv, args: dict[str, Any]) -> ToolOutput:
    text = env.sandbox.read_file(string_arg(args, "path"))
    start = args.get("start_line") or 1
    count = args.get("num_lines")
    if not isinstance(start, int) or start < 1 or (count is not None and (not isinstance(count, int) or count < 1)):
        raise ToolError("start_line and num_lines must be positive integers")
    lines = text.splitlines(keepends=True)
    chosen = lines[start - 1 : start - 1 + count if count else None]
    numbered = "".join(f"{start + i:6d}  {line}" for i, line in enumerate(chosen))
    header = f"{len(lines)} lines in total\n"
    return ToolOutput(truncate(header + (numbered or "(empty)\n"), env.output_chars))


def write_file(env: ToolEnv, args: dict[str, Any]) -> ToolOutput:
    path, content = string_arg(args, "path"), string_arg(args, "content")
    env.sandbox.write_file(path, content)
    return ToolOutput(f"wrote {len(content)} characters to {path}")


def edit_file(env: ToolEnv, args: dict[str, Any]) -> ToolOutput:
    path, old, new = string_arg(args, "path"), string_arg(args, "old_text"), string_arg(args, "new_text")
    if not old:
        raise ToolError("old_text is empty: give the exact text to replace")
    text = env.sandbox.read_file(path)
    count = text.count(old)
    if count == 0:
        raise ToolError(f"old_text not found in {path}: nothing changed (read the file and copy the text exactly)")
    if count > 1:
        raise ToolError(
            f"old_text occurs {count} times in {path}: nothing changed (include more context to make it unique)"
        )
    env.sandbox.write_file(path, text.replace(old, new, 1))
    return ToolOutput(f"replaced 1 occurrence in {path}")


def list_files(env: ToolEnv, args: dict[str, Any]) -> ToolOutput:
    path = string_arg(args, "path", ".")
    depth = args.get("max_depth", 2)
    if not isinstance(depth, int) or depth < 1:
        raise ToolError("max_depth must be a positive integer")
    # find runs in the sandbox, so this works the same wherever the workspace lives.
    command = (
        f"find {shlex.quote(path)} -mindepth 1 -maxdepth {depth} -name __pycache__ -prune -o "
        "-printf '%y %10s  %p\\n' | sort -k3 | head -n 2000"
    )
    timeout_s = min(60.0, env.remaining_s())
    if timeout_s <= 0:
        raise ToolError("not run: no wall time left")
    return describe_exec(env.sandbox.exec(command, timeout_s), timeout_s, env.output_chars)


def submit(env: ToolEnv, args: dict[str, Any]) -> ToolOutput:
    return ToolOutput("submitted: the run ends and your workspace is scored")


TIMEOUT_ARG = {"type": "number", "description": "Seconds before the command is killed (default set by the harness)."}

TOOLS: list[Tool] = [
    Tool(
        "bash",
        "Run a shell command (bash) in the workspace and return its exit code, stdout and stderr. "
        "Long outputs are truncated in the middle.",
        schema(
            {"command": {"type": "string", "description": "The command line."}, "timeout_s": TIMEOUT_ARG}, ["command"]
        ),
        shell,
    ),
    Tool(
        "run_python",
        "Run a Python file in the workspace: python PATH ARGS. Returns exit code, stdout and stderr.",
        schema(
            {
                "path": {"type": "string", "description": "The .py file, relative to the workspace."},
                "args": {
                    "type": "string",
                    "description": 'Command-line arguments (shell syntax), e.g. --data "$MLRB_DATA".',
                },
                "timeout_s": TIMEOUT_ARG,
            },
            ["path"],
        ),
        run_python,
    ),
    Tool(
        "read_file",
        "Read a text file of the workspace, with line numbers.",
        schema(
            {
                "path": {"type": "string"},
                "start_line": {"type": "integer", "description": "First line to show (1-based; default 1)."},
                "num_lines": {"type": "integer", "description": "How many lines to show (default: to the end)."},
            },
            ["path"],
        ),
        read_file,
    ),
    Tool(
        "write_file",
        "Create or overwrite a text file in the workspace with the given content.",
        schema({"path": {"type": "string"}, "content": {"type": "string"}}, ["path", "content"]),
        write_file,
    ),
    Tool(
        "edit_file",
        "Replace one exact occurrence of old_text with new_text in a file. Fails, changing nothing, "
        "if old_text is absent or occurs more than once.",
        schema(
            {"path": {"type": "string"}, "old_text": {"type": "string"}, "new_text": {"type": "string"}},
            ["path", "old_text", "new_text"],
        ),
        edit_file,
    ),
    Tool(
        "list_files",
        "List files and folders under a path of the workspace (type, size in bytes, path).",
        schema(
            {
                "path": {"type": "string", "description": "Folder to list (default: the workspace)."},
                "max_depth": {"type": "integer", "description": "How deep to go (default 2)."},
            },
            [],
        ),
        list_files,
    ),
    Tool(
        SUBMIT,
        "Say you are done: the run ends and the submission in your workspace is scored as it is.",
        schema({"summary": {"type": "string", "description": "What you did and what you submit."}}, []),
        submit,
    ),
]

BY_NAME: dict[str, Tool] = {tool.name: tool for tool in TOOLS}

# Tools that only touch files: a failure there is the model's mistake, reported back to it.
# A failing command runner is the sandbox's failure and ends the run as an infrastructure error.
FILE_TOOLS = {"read_file", "write_file", "edit_file"}


def run_tool(env: ToolEnv, name: str, args: dict[str, Any]) -> ToolOutput:
    tool = BY_NAME.get(name)
    if tool is None:
        return ToolOutput(f"error: unknown tool '{name}'; tools: {', '.join(BY_NAME)}", is_error=True)
    try:
        return tool.run(env, args)
    except ToolError as e:
        return ToolOutput(f"error: {e}", is_error=True)
    except Exception as e:
        if name not in FILE_TOOLS:
            raise
        return ToolOutput(f"error: {type(e).__name__}: {e}", is_error=True)
