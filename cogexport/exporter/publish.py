"""The last step of every export: check the destination, write the planned folder under a staging name (I/O only;
in a torchrun job, each rank its share of the files), move it into place, and upload it when asked."""

from __future__ import annotations

from pathlib import Path

from ..write.folder_plan import FolderPlan
from ..write.io_engine import IOSettings
from ..write.publish_plan import write_plan
from ..write.ranks import current_ranks
from ..write.staging import check_destination
from ..write.value_watch import passed_on_note
from .inputs import ExportInputs
from .options import ExportOptions
from .result import ExportResult


def publish(folder: FolderPlan, result: ExportResult, output: Path, inputs: ExportInputs,
            options: ExportOptions) -> ExportResult:
    ranks = current_ranks()
    passed_on = write_plan(folder, output, IOSettings(workers=options.workers), "export", options.progress, ranks,
                           check=lambda: check_destination(output, inputs.own_folders(), inputs.read_paths(options),
                                                           options.overwrite),
                           allow_nonfinite=options.allow_nonfinite)
    result.notes += filter(None, [passed_on_note(passed_on)])
    result.linked.update(folder.linked())
    if options.push_to_hub and ranks.leader:
        result.pushed_to = push_to_hub(output, options.push_to_hub, options.private)
    return result


def push_to_hub(folder: Path, repo_id: str, private: bool) -> str:
    from huggingface_hub import HfApi

    api = HfApi()
    repo = api.create_repo(repo_id, private=private, exist_ok=True)
    api.upload_folder(repo_id=repo.repo_id, folder_path=str(folder), commit_message="Upload with cogexport")
    return repo.repo_id
