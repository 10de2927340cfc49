"""`python -m autotune`: the same entry point as the `autotune` console script."""

from autotune.cli import main

if __name__ == "__main__":
    main()
