"""python -m moerl_pytorch grpo|sft ... (see cli.py)."""
from .cli import run

run()
