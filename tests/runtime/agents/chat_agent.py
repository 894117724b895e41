"""A small agent for the runtime tests: a multi-turn chat through the real openai SDK,
each turn forced by the built-in model's ``tracewire.force`` extension so runs compare
token for token. Prints one JSON line with the answers."""

import json
import os
import sys

import openai

turns = int(sys.argv[1]) if len(sys.argv) > 1 else 4
client = openai.OpenAI(max_retries=0, timeout=60)  # OPENAI_BASE_URL/_API_KEY from env
messages = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Count with me."}]
answers = []
for i in range(turns):
    r = client.chat.completions.create(
        model=os.environ.get("TRACEWIRE_MODEL", "tracewire-builtin"), messages=messages,
        max_tokens=32, temperature=0.0,
        extra_body={"tracewire": {"force": {"text": f"number {i} of {turns}"}}})
    text = r.choices[0].message.content or ""
    answers.append(text)
    messages += [{"role": "assistant", "content": text},
                 {"role": "user", "content": f"next after {i}"}]
print(json.dumps({"answers": answers}))
