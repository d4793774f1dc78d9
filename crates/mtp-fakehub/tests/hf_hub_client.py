"""The official huggingface_hub client against the fake Hub (run by tests/hf_hub.rs).

argv[1]: a JSON file naming the scenario and what to expect; HF_ENDPOINT points at the fake Hub.
Exits non-zero with a traceback on the first expectation that fails.
"""

import hashlib
import json
import os
import sys

import huggingface_hub
from huggingface_hub import HfApi, hf_hub_download, scan_cache_dir, snapshot_download
from huggingface_hub.errors import (
    GatedRepoError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def raises(kind, call, *args, **kwargs):
    try:
        call(*args, **kwargs)
    except kind as e:
        return e
    except Exception as e:  # the wrong error
        raise AssertionError(f"{call.__name__}{args}: expected {kind.__name__}, got {type(e).__name__}: {e}")
    raise AssertionError(f"{call.__name__}{args}: expected {kind.__name__}, it succeeded")


def check_snapshot(repo, commit, files, **kwargs):
    """snapshot_download gets every file with its bytes, into the snapshot of the commit."""
    folder = snapshot_download(repo, **kwargs)
    assert os.path.basename(folder) == commit, folder
    for path, digest in files.items():
        assert sha256(os.path.join(folder, path)) == digest, path
    return folder


def download(cfg):
    api = HfApi()
    repo, commit, files = cfg["repo"], cfg["commit"], cfg["files"]

    info = api.model_info(repo)
    assert info.sha == commit, info.sha
    assert sorted(s.rfilename for s in info.siblings) == sorted(files)
    info = api.model_info(repo, revision=commit, files_metadata=True)
    sizes = {s.rfilename: s.size for s in info.siblings}
    assert sizes == cfg["sizes"], sizes
    lfs = {s.rfilename: s.lfs.sha256 for s in info.siblings if s.lfs is not None}
    assert lfs == {p: files[p] for p in cfg["lfs"]}, lfs

    # the listing, paged by the fake Hub: every file once, and the folders
    tree = list(api.list_repo_tree(repo, recursive=True))
    file_paths = [e.path for e in tree if isinstance(e, huggingface_hub.hf_api.RepoFile)]
    folders = sorted(e.path for e in tree if isinstance(e, huggingface_hub.hf_api.RepoFolder))
    assert sorted(file_paths) == sorted(files), file_paths
    assert len(file_paths) == len(set(file_paths)), file_paths
    assert folders == cfg["folders"], folders
    for e in tree:
        if isinstance(e, huggingface_hub.hf_api.RepoFile):
            assert e.size == cfg["sizes"][e.path], e
            assert (e.lfs is not None) == (e.path in cfg["lfs"]), e
            if e.lfs is not None:
                assert e.lfs.sha256 == files[e.path], e
    top = sorted(e.path for e in api.list_repo_tree(repo))
    assert top == cfg["top"], top
    assert sorted(api.list_repo_files(repo)) == sorted(files)

    folder = check_snapshot(repo, commit, files)
    # by commit: the same snapshot, from the cache
    assert snapshot_download(repo, revision=commit) == folder
    one = hf_hub_download(repo, cfg["nested"], revision=commit)
    assert sha256(one) == files[cfg["nested"]]

    # the cache is whole and consistent
    cache = scan_cache_dir()
    assert not cache.warnings, cache.warnings
    [cached] = [r for r in cache.repos if r.repo_id == repo]
    assert cached.repo_type == "model"
    assert set(cached.refs) == {"main"}, cached.refs
    [revision] = list(cached.revisions)
    assert revision.commit_hash == commit
    cached_files = sorted(f.file_path.relative_to(revision.snapshot_path).as_posix() for f in revision.files)
    assert cached_files == sorted(files), cached_files
    assert cached.size_on_disk == sum(cfg["sizes"].values()), cached.size_on_disk

    # errors, typed as the client types the Hub's
    raises(RevisionNotFoundError, hf_hub_download, repo, cfg["nested"], revision="no-such-branch")
    raises(RevisionNotFoundError, snapshot_download, repo, revision="no-such-branch")
    raises(RemoteEntryNotFoundError, hf_hub_download, repo, "no/such/file.json")
    unknown = cfg["unknown"]
    for call in (snapshot_download, api.model_info):
        e = raises(RepositoryNotFoundError, call, unknown)
        assert not isinstance(e, GatedRepoError), e
    e = raises(RepositoryNotFoundError, hf_hub_download, unknown, "config.json")
    assert not isinstance(e, GatedRepoError), e

    gated, token = cfg["gated"], cfg["gated_token"]
    assert api.model_info(gated).gated == "manual"
    raises(GatedRepoError, snapshot_download, gated)
    raises(GatedRepoError, hf_hub_download, gated, "config.json")
    raises(GatedRepoError, hf_hub_download, gated, "config.json", token="hf_not_allowed")
    check_snapshot(gated, cfg["gated_commit"], files, token=token)
    assert not scan_cache_dir().warnings


def retry(cfg):
    """A download cut mid-body resumes (a Range request) and ends with the right bytes."""
    check_snapshot(cfg["repo"], cfg["commit"], cfg["files"])
    assert not scan_cache_dir().warnings


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        config = json.load(f)
    assert huggingface_hub.__version__ == "2.4.0", huggingface_hub.__version__
    {"download": download, "retry": retry}[config["scenario"]](config)
    print("ok")
