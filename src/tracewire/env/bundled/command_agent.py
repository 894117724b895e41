"""A small agent program for the ``command`` environment, written against the ``openai`` SDK.

It reads its task (JSON with ``system`` and ``question``) from stdin, asks the model once
through ``OPENAI_BASE_URL``/``OPENAI_API_KEY`` (set by the command harness), and prints the
answer on stdout. It imports nothing from tracewire: any program in any language would do.
"""

from __future__ import annotations

import json
import os
import sys

from openai import OpenAI


def main() -> int:
    task = json.loads(sys.stdin.read())
    sampling = json.loads(os.environ.get("TRACEWIRE_SAMPLING") or "{}")
    client = OpenAI(max_retries=0)  # base URL and key come from the environment
    resp = client.chat.completions.create(
        model=os.environ.get("TRACEWIRE_MODEL", "default"),
        messages=[
            {"role": "system", "content": task["system"]},
            {"role": "user", "content": task["question"]},
        ],
        **sampling,
    )
    print((resp.choices[0].message.content or "").strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
