"""``python -m titan`` is the same as the ``titan`` console script."""

from titan.cli.main import main

if __name__ == "__main__":
    main()
