"""A multi-turn chat loop written against the unmodified ``openai`` SDK, run as the agent
program of ``sdk_loop_env``: it asks a question, then a follow-up after each answer,
keeping the whole history (streamed when the task says so). It imports nothing of
tracewire; the base URL and key come from the environment the harness sets."""

from __future__ import annotations

import json
import os
import sys

from openai import OpenAI


def main() -> int:
    task = json.loads(sys.stdin.read())
    client = OpenAI(max_retries=0)
    model = os.environ.get("TRACEWIRE_MODEL", "default")
    messages = [{"role": "system", "content": "You are a helpful assistant."}]
    for text in task["turns"]:
        messages.append({"role": "user", "content": text})
        if task["stream"]:
            parts = []
            for chunk in client.chat.completions.create(
                    model=model, messages=messages, max_tokens=task["max_tokens"],
                    temperature=task["temperature"], seed=task["seed"], stream=True):
                if chunk.choices and chunk.choices[0].delta.content:
                    parts.append(chunk.choices[0].delta.content)
            reply = "".join(parts)
        else:
            resp = client.chat.completions.create(
                model=model, messages=messages, max_tokens=task["max_tokens"],
                temperature=task["temperature"], seed=task["seed"])
            reply = resp.choices[0].message.content or ""
        messages.append({"role": "assistant", "content": reply})
    print(json.dumps(messages))
    return 0


if __name__ == "__main__":
    sys.exit(main())
