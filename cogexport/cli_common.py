"""What every command of the command line shares: one line and exit code 2 for a user's mistake (and with --json,
one object saying so on stdout), the report and notes of rank 0 alone in a torchrun job, and the arguments and options
several commands take."""

from __future__ import annotations

import os
import signal
import sys
from contextlib import contextmanager, redirect_stdout
from functools import wraps
from pathlib import Path

import click

from .allocation import reuse_freed_tensor_memory
from .cli_json import print_failure
from .errors import CogExportError, ExtensionError, one_line
from .write.ranks import current_ranks, join_job


def user_errors_exit_2(command):
    """Print a CogExportError as one line on stderr and exit 2; let real bugs keep their traceback. With --json, the
    failure is also the run's one JSON object on stdout."""

    @wraps(command)
    def run(*args, **kwargs):
        # A killed run (or a closed terminal) must clean up its staging folder like Ctrl-C does.
        for signum in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, _stop)
        reuse_freed_tensor_memory()
        try:
            with join_job() as ranks:
                with quiet_unless(ranks.leader):
                    return command(*args, **kwargs)
        except CogExportError as error:
            fail(str(error), 2, kwargs.get("as_json", False))
        except OSError as error:  # the machine's answer about a path (permissions, disk full): not a bug of ours
            where = f": {error.filename}" if error.filename else ""
            fail(one_line(f"{error.strerror or error}{where}"), 2, kwargs.get("as_json", False))
        except ExtensionError as error:  # a family's data or a format's declaration (maybe another package's)
            fail(f"{error.kind}: {one_line(str(error))}", 2, kwargs.get("as_json", False))
        except KeyboardInterrupt:
            click.echo("cogexport: interrupted; nothing was written", err=True)
            if kwargs.get("as_json", False):
                print_failure("interrupted; nothing was written", 130)
            sys.exit(130)
        except StoppedBySignal as stop:  # its clean-up done on the way out: the run's end, said as any failure
            if kwargs.get("as_json", False):
                print_failure(f"stopped by {signal.Signals(stop.code - 128).name}; nothing was written", stop.code)
            raise

    return run


class StoppedBySignal(SystemExit):
    """The exit a SIGTERM or SIGHUP asks for (exit code 128 + the signal's number)."""


def _stop(number: int, _frame) -> None:
    raise StoppedBySignal(128 + number)


def fail(message: str, exit_code: int, as_json: bool) -> None:
    """End the run: its one error line on stderr (and its JSON object on stdout, with --json)."""
    click.echo(f"cogexport: error: {message}", err=True)
    if as_json:
        print_failure(message, exit_code)
    sys.exit(exit_code)


def say(kind: str, text: str) -> None:
    """A note or warning on stderr ("cogexport: warning: ..."), once per job: every process of a torchrun job runs
    the same command on the same input and would say the same thing, so rank 0 alone says it."""
    if current_ranks().leader:
        click.echo(f"cogexport: {kind}: {text}", err=True)


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
tag_option = click.option("--tag", help="Tag to read instead of the one named by 'latest' (e.g. global_step500), "
                                         "the step of a DCP run folder instead of the newest (e.g. checkpoint-500), "
                                         "the iteration of a Megatron-Core run instead of the one its "
                                         "latest_checkpointed_iteration.txt names (e.g. iter_0000500), or an "
                                         "imaginaire run's iteration (e.g. iter_000000500).")
role_option = click.option(
    "--role", metavar="NAME",
    help="The set of weights to read from a checkpoint that keeps several: a FastVideo run's role (student, critic, "
         "ema, ...), a state dict saved beside the module in a DeepSpeed or torch.save file (module, ema), or one of "
         "a model's two prefixed sets in one state dict (imaginaire's net and net_ema) [default: the trained "
         "weights: FastVideo's student, DeepSpeed's module, imaginaire's net, a note naming the set left unread].")
json_option = click.option("--json", "as_json", is_flag=True,
                           help="Print one JSON object on stdout instead of text, on failure too ({\"ok\": false, "
                                "\"error\": ..., \"exit_code\": ...}; the error line stays on stderr).")
verbose_option = click.option(
    "--verbose", is_flag=True,
    help="With --json: list every name of the checkpoint's trainable, frozen, tied and buffer tensors and every file "
         "read [default: the count and the first few of each].")
workers_option = click.option("--workers", type=click.IntRange(1), metavar="N",
                              help="Threads reading, checking and casting (or quantizing) tensors ahead of the writer "
                                   "(1: one thread does all in turn) [default: one per core but the writer's; one per "
                                   "core for --to gguf, whose big K-type and Q8_0 tensors are quantized in pieces by as "
                                   "many threads (worker processes where the compiled quantizer is not built), the "
                                   "next tensors read meanwhile by one more]. Under "
                                   "torchrun, each process writes its share of the files (of each file's tensors, "
                                   "where there are fewer files than processes), its workers its share of the cores.")
allow_nonfinite_option = click.option(
    "--allow-nonfinite", is_flag=True,
    help="Write tensors holding NaN or infinite values (a note names them) instead of refusing them: a damaged file "
         "or a diverged run, unless you know why they are there.")
