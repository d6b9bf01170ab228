"""The last step of every export: check the destination, write the planned folder under a staging name (I/O only),
move it into place, and upload it when asked."""

from __future__ import annotations

from pathlib import Path

from ..progress import byte_progress
from ..write.folder_plan import FolderPlan, write_folder
from ..write.staging import check_destination, staged_folder
from .inputs import ExportInputs
from .options import ExportOptions
from .result import ExportResult


def publish(folder: FolderPlan, result: ExportResult, output: Path, inputs: ExportInputs,
            options: ExportOptions) -> ExportResult:
    check_destination(output, inputs.own_folders(), inputs.read_paths(options), options.overwrite)
    with staged_folder(output, folder.total_bytes) as staging, \
            byte_progress(folder.total_bytes, "export", options.progress) as bar:
        write_folder(staging, folder, lambda _name, nbytes: bar.update(nbytes))
    result.linked.update(folder.linked())
    if options.push_to_hub:
        result.pushed_to = push_to_hub(output, options.push_to_hub, options.private)
    return result


def push_to_hub(folder: Path, repo_id: str, private: bool) -> str:
    from huggingface_hub import HfApi

    api = HfApi()
    repo = api.create_repo(repo_id, private=private, exist_ok=True)
    api.upload_folder(repo_id=repo.repo_id, folder_path=str(folder), commit_message="Upload with cogexport")
    return repo.repo_id
