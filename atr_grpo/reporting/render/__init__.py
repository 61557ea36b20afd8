"""What the analyses become on disk: CSV, Markdown and LaTeX tables, figures, curves and W&B reports."""
