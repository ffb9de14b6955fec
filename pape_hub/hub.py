"""Hub calls, all through ``huggingface_hub`` (works against any endpoint set by ``HF_ENDPOINT``)."""

from __future__ import annotations

from pathlib import Path

from huggingface_hub import HfApi

__all__ = ["push_checkpoint"]


def push_checkpoint(directory: str | Path, repo_id: str, private: bool = False, commit_message: str = "Add model"
                    ) -> str:
    """Upload a checkpoint folder (config, weights, code files, model card and plots if present) to ``repo_id``."""
    api = HfApi()
    repo = api.create_repo(repo_id, private=private, exist_ok=True)
    api.upload_folder(repo_id=repo.repo_id, folder_path=str(directory), commit_message=commit_message,
                      allow_patterns=["*.json", "*.safetensors", "*.md", "*.png", "*.py"])
    return str(repo)
