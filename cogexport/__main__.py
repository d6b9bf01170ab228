"""``python -m cogexport`` and the ``cogexport`` command. The export command is built from the families' data (its
choices and help), so a malformed family or format (of another installed package, say) is one line here, not a
traceback."""

import os
import sys


def run() -> None:
    """Run the command line, then leave at once. By the time a command returns its output is written, closed and
    published, and its report printed, so nothing is left for a normal exit to do but the two streams flushed below,
    and tearing the interpreter down costs: about half a second for torch's modules (a sixth of a 2 GB consolidate),
    and in a torchrun rank gloo's threads, torn down with it, now and then abort the process ("terminate called
    without an active exception", about one run in fifteen on a loaded 2-core machine), which would fail a job whose
    output is already published. An uncaught error still ends the normal way, with its traceback."""
    code = _run_command_line()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


# What this process wants of torch, set before torch is imported (it reads them as it loads) unless the user set them:
# no search of every installed package for device backends to load (cogexport computes on the CPU; the search reads
# every installed distribution's entry points: 0.06 s of a start).
TORCH_ENVIRONMENT = {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}


def _run_command_line() -> int:
    for name, value in TORCH_ENVIRONMENT.items():
        os.environ.setdefault(name, value)
    from .errors import ExtensionError, one_line

    try:
        main = _command_line()
        main()
    except SystemExit as done:  # click ends every run this way
        return _exit_code(done.code)
    except ExtensionError as error:  # a malformed family or format met while the command was built
        message = f"{error.kind}: {one_line(str(error))}"
        print(f"cogexport: error: {message}", file=sys.stderr)
        if "--json" in sys.argv[1:]:
            from .cli_json import print_failure

            print_failure(message, 2)
        return 2
    return 0


def _command_line():
    """The click command, imported with the cyclic collector paused, and everything the start made (torch's modules
    and cogexport's, the families' tables) then frozen: the collector never walks those objects again, as it did on
    every full pass while a plan was made; they live until the process ends anyway. 0.1 s of a start."""
    import gc

    gc.disable()
    try:
        import torch  # noqa: F401  every command uses it: imported here, to be paused for and frozen with the rest

        from .cli import main
    finally:
        gc.freeze()
        gc.enable()
    return main


def _exit_code(code: object) -> int:
    """What ``sys.exit(code)`` would make the process's exit status."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


if __name__ == "__main__":
    run()
