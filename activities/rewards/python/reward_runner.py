"""One sandboxed worker process of a reward function pool (activities/rewards/process-pool.ts).

Loads the user's function, then answers requests: one JSON object per line on stdin,
{"data_source", "solution_str", "ground_truth", "extra_info"}, is called as verl calls a custom
reward, compute_score(data_source=..., solution_str=..., ground_truth=..., extra_info=...), and
answered with one JSON line on file descriptor 3: {"value": score} or {"error": ..., "kind": ...}.
The function may print freely: stdout and stderr are read (and bounded) by the pool, never parsed.

    reward_runner.py (--module pkg.mod:function | --file path.py [--function name]) [--path DIR]...

Limits (time, CPU, memory, output) and isolation are applied from outside; this file only keeps
the protocol out of the function's way: stdin is replaced by /dev/null once the requests' pipe
is moved aside, and neither pipe is inherited by processes the function starts.
"""

import argparse
import importlib
import importlib.util
import json
import math
import os
import sys
import traceback

# The pipes' module beside this file (-I keeps this folder off sys.path), before any user code.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pool_pipes import open_pipes  # noqa: E402

del sys.path[0]


def load(args):
    for folder in reversed(args.path):
        sys.path.insert(0, folder)
    if args.module:
        module_name, _, function_name = args.module.partition(":")
        module = importlib.import_module(module_name)
        function_name = function_name or args.function
    else:
        spec = importlib.util.spec_from_file_location("moerl_reward_function", args.file)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {args.file}")
        module = importlib.util.module_from_spec(spec)
        sys.path.insert(0, os.path.dirname(os.path.abspath(args.file)))
        spec.loader.exec_module(module)
        function_name = args.function
    function = getattr(module, function_name, None)
    if not callable(function):
        raise AttributeError(f"{module.__name__} has no function {function_name!r}")
    return function


def describe(error):
    """'Type: message (file:line)' of the innermost frame, one line."""
    where = ""
    frames = traceback.extract_tb(error.__traceback__)
    if frames:
        frame = frames[-1]
        where = f" ({os.path.basename(frame.filename)}:{frame.lineno})"
    return f"{type(error).__name__}: {error}{where}"


def as_score(result):
    """verl's functions return a number, a bool, or a dict with "score"."""
    if isinstance(result, dict):
        if "score" not in result:
            raise ValueError(f"returned a dict without 'score' (keys: {sorted(result)[:10]})")
        result = result["score"]
    if isinstance(result, bool):
        return 1.0 if result else 0.0
    if isinstance(result, (int, float)) and math.isfinite(float(result)):
        return float(result)
    raise ValueError(f"returned {type(result).__name__} {str(result)[:80]!r}, not a finite number")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--module")
    parser.add_argument("--file")
    parser.add_argument("--function", default="compute_score")
    parser.add_argument("--path", action="append", default=[])
    args = parser.parse_args()

    requests, _, answer = open_pipes()

    try:
        function = load(args)
    except MemoryError:
        answer({"error": "MemoryError while loading the function", "kind": "memory"})
        return 1
    except BaseException as error:  # noqa: BLE001 -- any failure to load is reported, not raised
        answer({"error": f"could not load the function: {describe(error)}", "kind": "start"})
        return 1
    answer({"ready": True})

    for line in requests:
        request = json.loads(line)
        try:
            result = function(
                data_source=request["data_source"],
                solution_str=request["solution_str"],
                ground_truth=request["ground_truth"],
                extra_info=request["extra_info"],
            )
        except MemoryError:
            answer({"error": "MemoryError", "kind": "memory"})
            return 1
        except BaseException as error:  # noqa: BLE001 -- SystemExit and the like score 0 too
            answer({"error": describe(error), "kind": "exception"})
            continue
        try:
            answer({"value": as_score(result)})
        except ValueError as error:
            answer({"error": str(error), "kind": "bad-result"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
