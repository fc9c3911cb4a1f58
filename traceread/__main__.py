"""``python -m traceread``: the same command as the ``traceread`` console script."""

from traceread.cli import main

if __name__ == "__main__":
    main()
