"""`python -m toposdns`, and the `toposdns` console script (pyproject.toml's [project.scripts]
names `main` here): either way the stop signals are taken before the rest of toposdns is
imported."""

# Stop signals first: as PID 1 (a container without an init) an unhandled SIGTERM is lost.
from toposdns.lifecycle import exit_on_signals


def main() -> int:
    """The command line: SIGTERM and SIGINT end the process until it serves (`exit_on_signals`),
    then `toposdns.cli.main`, whose imports take a second or more."""
    exit_on_signals()
    from toposdns.cli import main as run

    return run()


if __name__ == "__main__":
    raise SystemExit(main())
