"""The official huggingface_hub client against the cache `mtp` writes, and the cache it
writes for `mtp` (crates/mtp/tests/cli_models.rs, `hf_hub_*`).

usage: interop.py read  CACHE EXPECTED_JSON   -- offline: find what mtp downloaded
       interop.py fetch CACHE REPO            -- online (HF_ENDPOINT): download a snapshot

EXPECTED_JSON: {"repo": {"snapshot": path, "files": {name: sha256}}}.
Prints one line "ok ..." and exits 0, or raises.
"""
import hashlib
import json
import os
import sys

from huggingface_hub import hf_hub_download, scan_cache_dir, snapshot_download


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read(cache, expected):
    assert os.environ.get("HF_HUB_OFFLINE") == "1", "the read check runs offline"
    for repo, want in expected.items():
        path = snapshot_download(repo, cache_dir=cache, local_files_only=True)
        assert os.path.realpath(path) == os.path.realpath(want["snapshot"]), (path, want["snapshot"])
        for name, digest in want["files"].items():
            one = hf_hub_download(repo, name, cache_dir=cache, local_files_only=True)
            assert sha256(one) == digest, (repo, name)
    info = scan_cache_dir(cache)
    assert not info.warnings, [str(w) for w in info.warnings]
    found = {r.repo_id: r for r in info.repos}
    for repo, want in expected.items():
        r = found[repo]
        assert r.repo_type == "model"
        revs = list(r.revisions)
        assert len(revs) == 1, revs
        assert "main" in revs[0].refs, revs[0].refs
        assert {f.file_path.relative_to(revs[0].snapshot_path).as_posix() for f in revs[0].files} == set(
            want["files"]
        )
    print(f"ok read {len(expected)} repos, scan_cache_dir: {len(info.repos)} repos, no warnings")


def fetch(cache, repo):
    path = snapshot_download(repo, cache_dir=cache)
    info = scan_cache_dir(cache)
    assert not info.warnings, [str(w) for w in info.warnings]
    print(f"ok fetched {repo} into {path}")


if __name__ == "__main__":
    mode, cache = sys.argv[1], sys.argv[2]
    if mode == "read":
        read(cache, json.loads(sys.argv[3]))
    elif mode == "fetch":
        fetch(cache, sys.argv[3])
    else:
        raise SystemExit(f"unknown mode {mode}")
