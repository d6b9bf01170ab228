"""What every command of the command line shares: one line and exit code 2 for a user's mistake, the report of
rank 0 alone in a torchrun job, and the arguments and options several commands take."""

from __future__ import annotations

import os
import signal
import sys
from contextlib import contextmanager, redirect_stdout
from functools import wraps
from pathlib import Path

import click

from .allocation import reuse_freed_tensor_memory
from .errors import CogExportError, ExtensionError, one_line
from .write.ranks import join_job


def user_errors_exit_2(command):
    """Print a CogExportError as one line on stderr and exit 2; let real bugs keep their traceback."""

    @wraps(command)
    def run(*args, **kwargs):
        # A killed run (or a closed terminal) must clean up its staging folder like Ctrl-C does.
        for signum in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, lambda number, _frame: sys.exit(128 + number))
        reuse_freed_tensor_memory()
        try:
            with join_job() as ranks:
                with quiet_unless(ranks.leader):
                    result = command(*args, **kwargs)
        except CogExportError as error:
            click.echo(f"cogexport: error: {error}", err=True)
            sys.exit(2)
        except OSError as error:  # the machine's answer about a path (permissions, disk full): not a bug of ours
            where = f": {error.filename}" if error.filename else ""
            click.echo(f"cogexport: error: {one_line(f'{error.strerror or error}{where}')}", err=True)
            sys.exit(2)
        except ExtensionError as error:  # a family's data or a format's declaration (maybe another package's)
            click.echo(f"cogexport: error: {error.kind}: {one_line(str(error))}", err=True)
            sys.exit(2)
        except KeyboardInterrupt:
            click.echo("cogexport: interrupted; nothing was written", err=True)
            sys.exit(130)
        return result

    return run


@contextmanager
def quiet_unless(speaking: bool):
    """The ranks of a torchrun job but rank 0 print no report (their errors still go to stderr)."""
    if speaking:
        yield
        return
    with open(os.devnull, "w") as devnull, redirect_stdout(devnull):
        yield


checkpoint_paths = click.argument("checkpoint", nargs=-1, required=True, type=click.Path(path_type=Path))
output_path = click.argument("output", type=click.Path(path_type=Path))
tag_option = click.option("--tag", help="Tag to read instead of the one named by 'latest' (e.g. global_step500), or "
                                         "the step of a DCP run folder instead of the newest (e.g. checkpoint-500).")
role_option = click.option(
    "--role", metavar="NAME",
    help="The set of weights to read from a checkpoint that keeps several: a FastVideo run's role (student, critic, "
         "ema, ...), or a state dict saved beside the module in a DeepSpeed or torch.save file (module, ema) "
         "[default: the trained weights: FastVideo's student, DeepSpeed's module].")
json_option = click.option("--json", "as_json", is_flag=True, help="Print a JSON object instead of text.")
workers_option = click.option("--workers", type=click.IntRange(1), metavar="N",
                              help="Threads reading, checking and casting (or quantizing) tensors ahead of the writer "
                                   "(1: one thread does all in turn) [default: one per core but the writer's; one per "
                                   "core for --to gguf]. Under torchrun, each process writes its share of the files "
                                   "(of each file's tensors, where there are fewer files than processes).")
allow_nonfinite_option = click.option(
    "--allow-nonfinite", is_flag=True,
    help="Write tensors holding NaN or infinite values (a note names them) instead of refusing them: a damaged file "
         "or a diverged run, unless you know why they are there.")
