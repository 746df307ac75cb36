"""``python -m delayq.cli``."""

from delayq.cli.app import main

if __name__ == "__main__":
    raise SystemExit(main())
