"""The pipes of a sandboxed pool worker (activities/rewards/process-pool.ts), shared by the
reward runner and the tool runner: requests arrive one JSON object a line on stdin, answers go
one JSON line a request on file descriptor 3. Stdin is replaced by /dev/null once the requests'
pipe is moved aside, and the answers' pipe is not inherited by processes the code starts, so the
code run for a request can neither read the next request nor forge an answer."""

import json
import os
import sys


def open_pipes():
    """(requests, answer): the requests' lines, and a function writing one answer line (stdout
    and stderr flushed first, so that what the code printed precedes its answer)."""
    requests = os.fdopen(os.dup(0), "r", encoding="utf-8")
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.set_inheritable(3, False)
    answers = os.fdopen(3, "w", encoding="utf-8", buffering=1)

    def answer(message):
        sys.stdout.flush()
        sys.stderr.flush()
        answers.write(json.dumps(message) + "\n")

    return requests, answers, answer
