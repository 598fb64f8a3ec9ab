"""Command-line tools: tfm-chat, tfm-bench (thin: parse, call, print)."""
