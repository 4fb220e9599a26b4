"""The official `openai` client against the served /v1/chat/completions.

Usage: python openai_chat.py BASE_URL   (e.g. http://127.0.0.1:PORT/v1)
Exits non-zero, saying why, when an answer is not what the agent gives.
"""

import sys

import openai

base_url = sys.argv[1]
client = openai.OpenAI(base_url=base_url, api_key="not-needed", max_retries=0, timeout=30)

# Not streamed.
completion = client.chat.completions.create(
    model="calc",
    messages=[{"role": "user", "content": "What is 2 + 3?"}],
)
assert completion.object == "chat.completion", completion
assert completion.choices[0].message.role == "assistant", completion
assert completion.choices[0].message.content == "2 + 3 = 5", completion
assert completion.choices[0].finish_reason == "stop", completion
assert completion.usage is not None and completion.usage.total_tokens >= 0, completion

# Streamed, with usage at the end.
stream = client.chat.completions.create(
    model="calc",
    messages=[{"role": "user", "content": "What is 2 + 3?"}],
    stream=True,
    stream_options={"include_usage": True},
)
text, finish, usage, chunks = "", None, None, 0
for chunk in stream:
    chunks += 1
    if chunk.usage is not None:
        usage = chunk.usage
    for choice in chunk.choices:
        text += choice.delta.content or ""
        finish = choice.finish_reason or finish
assert text == "2 + 3 = 5", text
assert finish == "stop", finish
assert usage is not None, "no usage chunk"
assert chunks >= 3, f"streamed in {chunks} chunks"

# An error is an APIStatusError with our JSON body.
try:
    client.chat.completions.create(model="calc", messages=[])
except openai.BadRequestError as e:
    assert e.status_code == 400, e
else:
    raise AssertionError("an empty conversation was accepted")

print(f"openai {openai.__version__}: non-streamed and streamed ({chunks} chunks) ok")
