"""One sandboxed worker process of a tools pool (activities/agents/sandbox-tools.ts).

Loads a Python module of tool functions, then answers tool calls over the protocol of the reward
pools (activities/rewards/process-pool.ts, as activities/rewards/python/reward_runner.py speaks
it): one JSON object per line on stdin, {"name": ..., "arguments": {...}}, is run as
name(**arguments) and answered with one JSON line on file descriptor 3, {"value": text} or
{"error": message, "kind": reason}; {"ready": true} first, once the module is loaded.

    tool_runner.py --file tools.py [--tool NAME]... [--max-result-chars N]

The process is pooled, so one episode's calls and the next episode's meet the same process: no
call may leave anything for a later one. Each call therefore runs in a child forked for it, in a
fresh scratch folder of its own, and the child's result comes back through a pipe; this process
never runs tool code, so its memory (globals, builtins, imported modules) stays as loaded, and
what a call wrote in the scratch folder is removed once it is done. A child that dies, or exits
without a result, is that call's error; the next call gets a fresh child all the same.

A tool returns a string, or anything JSON-serialisable (answered as its JSON text). It may
raise: an exception of a class named ToolError is answered with its message alone (the message
is meant for the model), any other as "Type: message". Limits (time, CPU, memory, output) and
isolation are applied from outside, as for reward functions (activities/rewards/sandbox.ts).
"""

import argparse
import importlib.util
import inspect
import json
import os
import select
import shutil
import signal
import sys
import tempfile

# The pool's pipes are the reward runner's (activities/rewards/python), before any tool code.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "rewards", "python"))
from pool_pipes import open_pipes  # noqa: E402

del sys.path[0]

# Bytes a child may send back; far past a bounded result, so only a tool writing to the result
# pipe itself meets it.
MAX_CHILD_MESSAGE_BYTES = 16 * 1024 * 1024
# Longest error message sent: the pool kills a process whose answer line is too long.
MAX_ERROR_CHARS = 4000
# How often a parent waiting on its child checks whether the child is gone: a process the tool
# started may hold the result pipe open after the child exited.
CHILD_POLL_SECONDS = 0.05

# What a child uses once its tool has run, bound now: a tool may monkeypatch json, os or builtins
# in its child, and that must not stop the child from answering or make it return into the loop.
_exit, _write, _len, _str, _type = os._exit, os.write, len, str, type
_encode_answer = json.JSONEncoder().encode
_encode_result = json.JSONEncoder(ensure_ascii=False, allow_nan=False).encode


def load_tools(path, wanted):
    spec = importlib.util.spec_from_file_location("moerl_tools", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    spec.loader.exec_module(module)
    if wanted:
        missing = [name for name in wanted if not inspect.isfunction(getattr(module, name, None))]
        if missing:
            raise AttributeError(f"{os.path.basename(path)} has no function {', '.join(missing)}")
        names = wanted
    else:
        # Every public function defined in the file itself (not those it imported).
        names = [
            name
            for name, value in vars(module).items()
            if inspect.isfunction(value) and not name.startswith("_") and value.__module__ == module.__name__
        ]
    return {name: getattr(module, name) for name in names}


def cut(text, limit):
    if _len(text) <= limit:
        return text
    note = f"\n... ({_len(text) - limit} more characters cut)"
    return text[: max(0, limit - len(note))] + note


def describe(error):
    if _type(error).__name__ == "ToolError":
        return _str(error)
    return f"{_type(error).__name__}: {error}"


class BadResult(Exception):
    """A tool returned something that is neither text nor JSON."""


def as_text(result):
    if _type(result) is _str:
        return result
    try:
        return _encode_result(result)
    except (TypeError, ValueError, RecursionError) as error:
        raise BadResult(f"returned {type(result).__name__}, which is neither a string nor JSON: {error}") from None


def run_in_child(tool, arguments, call_dir, write_end, max_result_chars):
    """In the forked child: runs the tool, writes its answer to `write_end`, and never returns."""
    status = 0
    try:
        os.chdir(call_dir)
        os.environ["HOME"] = os.environ["TMPDIR"] = os.environ["PWD"] = call_dir
        tempfile.tempdir = call_dir
        try:
            message = {"value": cut(as_text(tool(**arguments)), max_result_chars)}
        except MemoryError:
            message = {"error": "MemoryError", "kind": "memory"}
        except BadResult as error:
            message = {"error": cut(str(error), MAX_ERROR_CHARS), "kind": "bad-result"}
        except BaseException as error:  # noqa: BLE001 -- SystemExit and the like are the call's error too
            message = {"error": cut(describe(error), MAX_ERROR_CHARS), "kind": "exception"}
        view = memoryview(_encode_answer(message).encode())
        while view:
            view = view[_write(write_end, view) :]
    except BaseException:  # noqa: BLE001 -- whatever happens, the child must not return into the loop
        status = 70
    finally:
        # The tool's own output, then out without running anything of the parent's (atexit, buffers).
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:  # noqa: BLE001
            pass
        _exit(status)


def wait_for_child(pid, read_end):
    """The child's message bytes (possibly incomplete) and its wait status, once it is gone."""
    chunks, size, status = [], 0, None
    os.set_blocking(read_end, False)
    while status is None:
        ready, _, _ = select.select([read_end], [], [], CHILD_POLL_SECONDS)
        if ready:
            chunk = read_available(read_end)
            if chunk is None:  # end of file: the child is exiting
                _, status = os.waitpid(pid, 0)
            else:
                size += len(chunk)
                if size > MAX_CHILD_MESSAGE_BYTES:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                    return None, "too-large"
                chunks.append(chunk)
            continue
        done, wait_status = os.waitpid(pid, os.WNOHANG)
        if done:
            status = wait_status
    while (chunk := read_available(read_end)) not in (None, b""):
        chunks.append(chunk)
    return b"".join(chunks), status


def read_available(fd):
    """Bytes ready on a non-blocking fd; b"" when none are, None at end of file."""
    try:
        chunk = os.read(fd, 65536)
    except BlockingIOError:
        return b""
    return chunk if chunk else None


def child_failure(status):
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        kind = "cpu" if number == signal.SIGXCPU else "crash"
        return {"error": f"the tool's process was killed by {signal.Signals(number).name}", "kind": kind}
    return {"error": f"the tool's process exited with code {os.waitstatus_to_exitcode(status)}", "kind": "crash"}


def run_call(tool, arguments, scratch, max_result_chars, protocol_fds):
    call_dir = tempfile.mkdtemp(prefix="call-", dir=scratch)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            # The requests and answers are the parent's alone: a tool can neither read the next
            # call nor answer one.
            for fd in [read_end, *protocol_fds]:
                os.close(fd)
            # Its own group, so what the tool started and left behind can be ended with it.
            os.setpgid(0, 0)
            run_in_child(tool, arguments, call_dir, write_end, max_result_chars)
        finally:
            _exit(70)
    os.close(write_end)
    try:
        data, status = wait_for_child(pid, read_end)
    finally:
        os.close(read_end)
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass  # nothing of it is left
    if status == "too-large":
        return {"error": "the tool sent back more than its result may hold", "kind": "bad-result"}
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
        try:
            message = json.loads(data)
            if isinstance(message, dict) and ("value" in message or "error" in message):
                return message
        except ValueError:
            pass
    return child_failure(status)


def clear_scratch(scratch, keep):
    """Removes what a call left in the scratch folder: every entry that was not there at start."""
    for name in os.listdir(scratch):
        if name in keep:
            continue
        path = os.path.join(scratch, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            try:
                os.unlink(path)
            except OSError:
                pass


def forbid_tracing():
    """A child may not ptrace this process (or write its /proc/<pid>/mem) to leave state in it."""
    try:
        import ctypes

        PR_SET_DUMPABLE = 4
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    except (OSError, AttributeError, ImportError):
        pass  # best effort: a platform without prctl has no ptrace of this kind either


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--file", required=True)
    parser.add_argument("--tool", action="append", default=[])
    parser.add_argument("--max-result-chars", type=int, default=16000)
    args = parser.parse_args()

    requests, answers, answer = open_pipes()

    scratch = os.getcwd()
    keep = set(os.listdir(scratch))
    forbid_tracing()
    try:
        tools = load_tools(args.file, args.tool)
    except MemoryError:
        answer({"error": "MemoryError while loading the tools", "kind": "memory"})
        return 1
    except BaseException as error:  # noqa: BLE001 -- any failure to load is reported, not raised
        answer({"error": cut(f"could not load the tools: {describe(error)}", MAX_ERROR_CHARS), "kind": "start"})
        return 1
    answer({"ready": True})

    for line in requests:
        request = json.loads(line)
        name, arguments = request.get("name"), request.get("arguments")
        tool = tools.get(name) if isinstance(name, str) else None
        if tool is None:
            known = ", ".join(sorted(tools)) or "none"
            answer({"error": f"unknown tool {json.dumps(name)}; the tools are: {known}", "kind": "exception"})
        elif not isinstance(arguments, dict):
            answer({"error": "the arguments must be a JSON object", "kind": "exception"})
        else:
            try:
                protocol_fds = [requests.fileno(), answers.fileno()]
                answer(run_call(tool, arguments, scratch, args.max_result_chars, protocol_fds))
            finally:
                clear_scratch(scratch, keep)
    return 0


if __name__ == "__main__":
    sys.exit(main())
