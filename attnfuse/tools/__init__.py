"""Command-line tools: attnfuse-opt and attnfuse-bench."""
