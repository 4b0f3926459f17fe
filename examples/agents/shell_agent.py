"""A small research agent of your own, run by mlrb as `agent=command` (docs/agents.md).

It asks a model what to do, runs the shell commands the model asks for in the workspace, sends
back their output, and stops when the model calls no more tools. It knows nothing of mlrb: the
run gives it the task in $MLRB_PROMPT and the run's metering proxy as the Anthropic API
($ANTHROPIC_BASE_URL, with the run's token as $ANTHROPIC_API_KEY), which the official SDK reads
by itself. The proxy counts its tokens and dollars, refuses calls once the budget is spent, and
records every call and command as the run's events; the harness's clock stops it at the wall
time limit.

    ANTHROPIC_API_KEY=... python -m mlrb task=llm_merging agent=command \
        agent.options.program_dir=examples/agents agent.options.command='python $MLRB_AGENT_DIR/shell_agent.py'
"""

import os
import subprocess

import anthropic

MODEL = os.environ.get("MLRB_MODEL", "claude-sonnet-5")  # the run's agent.options.model
BASH = {
    "name": "bash",
    "description": "Run a shell command in the workspace; returns its exit status and output.",
    "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
}


def run(command: str) -> str:
    done = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=3600)
    return f"exit status {done.returncode}\n{done.stdout[-10_000:]}{done.stderr[-10_000:]}"


def main() -> None:
    client = anthropic.Anthropic()  # its base URL and key from the environment: the run's proxy
    messages = [{"role": "user", "content": os.environ["MLRB_PROMPT"]}]
    while True:
        try:
            reply = client.messages.create(model=MODEL, max_tokens=4096, tools=[BASH], messages=messages)
        except anthropic.BadRequestError as e:  # the budget is spent: the proxy says so
            print("stopped:", e.message)
            return
        messages.append({"role": "assistant", "content": reply.content})
        calls = [block for block in reply.content if block.type == "tool_use"]
        for block in reply.content:
            print(block.text if block.type == "text" else f"$ {block.input.get('command')}", flush=True)
        if not calls:
            return
        results = [{"type": "tool_result", "tool_use_id": c.id, "content": run(c.input.get("command", ""))}
                   for c in calls]  # fmt: skip
        messages.append({"role": "user", "content": results})


if __name__ == "__main__":
    main()
