"""bridge/wire/git.py's Reader: one `git cat-file --batch-command` kept per repository for every object read,
against real repositories: what it answers must be what a fresh git would, whatever happened meanwhile."""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

import pytest

from bridge.core.errors import BusError
from bridge.wire import git as G


def repo_with(tmp: Path, files: dict[str, bytes]) -> tuple[Path, str]:
    repo = tmp / "r"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    for name, data in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_bytes(data)
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
    subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c"],
        check=True,
    )
    return repo, G.out(repo, "rev-parse", "HEAD")


def test_objects_written_after_the_reader_started_are_seen(tmp_path: Path):
    repo, head = repo_with(tmp_path, {"a.txt": b"a"})
    blob = G.out(repo, "hash-object", "--stdin", input=b"later\n")  # not written yet: only hashed
    assert G.present(repo, [head, blob]) == {head}
    G.write_blobs(repo, [b"later\n"])  # a loose object, by another git
    subprocess.run(["git", "-C", str(repo), "repack", "-adq"], check=True)  # and now in a new pack
    assert G.present(repo, [head, blob]) == {head, blob}
    assert G.read_blobs(repo, [blob]) == {blob: b"later\n"}


def test_large_blobs_many_specs_and_names_it_cannot_send(tmp_path: Path):
    big = os.urandom(3 << 20)  # far over a pipe's 64 kB, both ways
    files = {f"d/{i:03d}.txt": f"{i}\n".encode() for i in range(300)}  # commands over CHUNK_BYTES
    repo, head = repo_with(tmp_path, {"big.bin": big, **files})
    specs = [f"{head}:{name}" for name in files]
    odd = [f"{head}:big.bin\n{head}:d/001.txt", " " + head, "", f"{head}:nope"]
    sizes = G.blob_sizes(repo, [*specs, *odd, f"{head}:big.bin"])
    assert sizes == {**{s: len(files[s.split(":", 1)[1]]) for s in specs}, f"{head}:big.bin": len(big)}
    assert G.read_blobs(repo, [f"{head}:big.bin", *odd, specs[7]]) == {
        f"{head}:big.bin": big,
        specs[7]: b"7\n",
    }
    assert G.read_blobs(repo, [f"{head}:d"]) == {}  # a tree where a blob was asked for
    assert G.read_blobs(repo, specs) == {s: files[s.split(":", 1)[1]] for s in specs}  # in several chunks
    long = f"{head}:" + "x" * 40000  # a name alone over CHUNK_BYTES: sent alone
    assert G.blob_sizes(repo, [long, *specs[:3]]) == {s: 2 for s in specs[:3]}
    assert [len(c) for c in G.chunks(["a" * 9000, "b", "c" * 9000, "d" * 20000])] == [2, 1, 1]
    assert G.ls_tree(repo, f"{head}:d")["005.txt"][1] == "blob"


def test_a_reader_that_died_is_started_again_and_a_missing_repository_says_so(tmp_path: Path):
    repo, head = repo_with(tmp_path, {"a.txt": b"a"})
    assert G.present(repo, [head]) == {head}
    G._reader(repo).proc.kill()
    assert G.present(repo, [head]) == {head}
    with pytest.raises(BusError, match="not a git repository"):
        G.present(tmp_path, [head])
    with pytest.raises(BusError, match="cannot read objects"):
        G.present(tmp_path / "gone", [head])


def test_a_store_emptied_and_made_again_is_read_afresh(tmp_path: Path):
    repo, head = repo_with(tmp_path, {"a.txt": b"a"})
    store = G.init_bare(tmp_path / "store.git")
    subprocess.run(["git", "-C", str(store), "fetch", "-q", str(repo), "HEAD"], check=True)
    assert G.present(store, [head]) == {head}
    G.forget(store)  # what Bus.side(empty=True) does before it deletes a side store
    subprocess.run(["rm", "-rf", str(store)], check=True)
    G.init_bare(store)
    assert G.present(store, [head]) == set()
    G.borrow_objects(store, repo / ".git" / "objects")  # new alternates: its reader is dropped
    assert G.present(store, [head]) == {head}


def test_threads_share_a_reader_one_batch_at_a_time(tmp_path: Path):
    files = {f"{i}.txt": os.urandom(20000) for i in range(40)}
    repo, head = repo_with(tmp_path, files)
    errors: list[str] = []

    def read(names: list[str]) -> None:
        for _ in range(5):
            got = G.read_blobs(repo, [f"{head}:{n}" for n in names])
            if got != {f"{head}:{n}": files[n] for n in names}:
                errors.append("a thread read another thread's answer")

    names = sorted(files)
    threads = [threading.Thread(target=read, args=(names[i::4],)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
