"""``python -m cogexport`` and the ``cogexport`` command. The command line is built from the families' data (its
choices and help), so a malformed family (of another installed package, say) is one line here, not a traceback."""

import sys


def run() -> None:
    from .errors import one_line
    from .keymap.table import TableError
    from .models.family import FamilyError

    try:
        from .cli import main
    except (FamilyError, TableError) as error:
        print(f"cogexport: error: key maps: {one_line(str(error))}", file=sys.stderr)
        sys.exit(2)
    main()


if __name__ == "__main__":
    run()
