"""The tools moerl ships for agentic rollouts, run by tool_runner.py in the reward sandbox.

- calculator(expression): arithmetic only. The expression is parsed with `ast` and only numbers,
  + - * / // % ** and parentheses are evaluated (no names, calls or attributes), with sizes
  bounded before each operation runs, so that `9**9**9` is refused at once instead of eating the
  call's CPU time.
- python(code): a code interpreter cell. The code runs with exec in a fresh namespace and the
  result is what it printed (stdout and stderr, its subprocesses' too, bounded in size) and the
  repr of its last expression when it ends with one, as a notebook shows a cell.

Both run in a child that tool_runner.py forks for the call, so a cell may change anything
(globals, builtins, modules, files in its folder): none of it reaches the next call.
"""

import ast
import builtins
import linecache
import math
import operator
import os
import sys
import threading
import traceback


class ToolError(Exception):
    """An error meant for the model: tool_runner.py answers it with its message alone."""


# ---- calculator ----

MAX_EXPRESSION_CHARS = 2000
# Integers past this many bits are refused: about 3000 digits, well within what str() prints.
MAX_INT_BITS = 10_000

BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}
ALLOWED = "numbers, + - * / // % ** and parentheses"


def _int_bits(value):
    return abs(value).bit_length() if isinstance(value, int) else 0


def _check_size(op, left, right):
    """Refuses an operation whose integer result would pass MAX_INT_BITS, before it runs."""
    if op is ast.Pow and isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1:
        # |left| ** right has about right * log2|left| bits.
        if right * math.log2(abs(left)) > MAX_INT_BITS:
            raise ToolError(f"the result of {left} ** {right} is too large (more than {MAX_INT_BITS} bits)")
    if op is ast.Mult and _int_bits(left) + _int_bits(right) > MAX_INT_BITS + 1:
        raise ToolError(f"the result is too large (more than {MAX_INT_BITS} bits)")


def _evaluate(node):
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
            raise ToolError(f"{node.value!r} is not a number; only {ALLOWED} are allowed")
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in UNARY:
        return UNARY[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        _check_size(type(node.op), left, right)
        try:
            result = BINARY[type(node.op)](left, right)
        except ZeroDivisionError:
            raise ToolError("division by zero") from None
        except OverflowError:
            raise ToolError("the result is too large for a floating-point number") from None
        if isinstance(result, complex):
            raise ToolError(f"{left} ** {right} is not a real number")
        if _int_bits(result) > MAX_INT_BITS:
            raise ToolError(f"the result is too large (more than {MAX_INT_BITS} bits)")
        return result
    if isinstance(node, ast.Name):
        raise ToolError(f"unknown name {node.id!r}: only {ALLOWED} are allowed")
    raise ToolError(f"{type(node).__name__} is not allowed: only {ALLOWED} are")


def calculator(expression):
    """The value of an arithmetic expression, as text: "2 ** 10 / 4" gives "256.0"."""
    if not isinstance(expression, str):
        raise ToolError("expression must be a string")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ToolError(f"the expression is longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as error:
        raise ToolError(f"not an arithmetic expression: {error.msg}") from None
    except (RecursionError, MemoryError, ValueError):
        raise ToolError("the expression is nested too deeply") from None
    try:
        result = _evaluate(tree)
    except RecursionError:
        raise ToolError("the expression is nested too deeply") from None
    if isinstance(result, float) and not math.isfinite(result):
        raise ToolError(f"the result is {result}")
    return repr(result)


# ---- python ----

MAX_OUTPUT_BYTES = 8000
MAX_VALUE_CHARS = 2000
CELL = "<cell>"
# How long the output is read after the cell ends while a process it started still holds it.
OUTPUT_DRAIN_SECONDS = 1.0


class BoundedCapture:
    """Reads a pipe to its end in a thread, keeping the first MAX_OUTPUT_BYTES and counting the rest."""

    def __init__(self, fd):
        self.fd = fd
        self.kept = bytearray()
        self.dropped = 0
        self.thread = threading.Thread(target=self.drain, daemon=True)
        self.thread.start()

    def drain(self):
        # Read on past the limit, so a writer is never blocked on a full pipe.
        while chunk := os.read(self.fd, 65536):
            room = MAX_OUTPUT_BYTES - len(self.kept)
            self.kept += chunk[:room]
            self.dropped += max(0, len(chunk) - room)

    def text(self):
        self.thread.join(OUTPUT_DRAIN_SECONDS)
        text = self.kept.decode("utf-8", errors="replace")
        if self.dropped:
            text += f"\n... ({self.dropped} more bytes of output cut)"
        return text


def _run_cell(code, namespace):
    """Runs the cell; the repr of its last expression, or None when it does not end with one."""
    tree = ast.parse(code, filename=CELL, mode="exec")
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    exec(compile(tree, CELL, "exec"), namespace)
    if last is None:
        return None
    value = eval(compile(ast.Expression(last.value), CELL, "eval"), namespace)
    return None if value is None else repr(value)


def _cell_traceback(error):
    """The traceback from the cell's own frames on, as Python prints it."""
    tb = error.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != CELL:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(error), error, tb))


def python(code):
    """Runs a cell of Python code; what it printed, then the repr of its last expression."""
    if not isinstance(code, str):
        raise ToolError("code must be a string")
    # Lines for the cell's tracebacks.
    linecache.cache[CELL] = (len(code), None, code.splitlines(True), CELL)
    read_end, write_end = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    # Descriptors 1 and 2 themselves, so that processes the cell starts print into the result too.
    os.dup2(write_end, 1)
    os.dup2(write_end, 2)
    os.close(write_end)
    capture = BoundedCapture(read_end)
    out = open(1, "w", encoding="utf-8", errors="replace", buffering=1, closefd=False)
    streams = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = out
    value, failure, exit_note = None, None, ""
    try:
        value = _run_cell(code, {"__name__": "__main__", "__builtins__": builtins})
    except SystemExit as stop:
        exit_note = "" if stop.code in (None, 0) else f"(exited with {stop.code!r})"
    except SyntaxError as error:
        failure = "".join(traceback.format_exception_only(type(error), error))
    except Exception as error:  # noqa: BLE001 -- the cell's error is its result, as a notebook shows it
        failure = _cell_traceback(error)
    finally:
        try:
            out.flush()
        except OSError:
            pass
        sys.stdout, sys.stderr = streams
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)
    parts = [capture.text().rstrip("\n")]
    if value is not None:
        parts.append(value if len(value) <= MAX_VALUE_CHARS else value[:MAX_VALUE_CHARS] + "...")
    parts.append(exit_note)
    text = "\n".join(part for part in parts if part)
    if failure is not None:
        raise ToolError("\n".join(part for part in [text, failure.rstrip("\n")] if part))
    return text or "(no output)"
