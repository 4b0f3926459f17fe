"""A stand-in Hugging Face Hub on loopback, for tests of the online path (`mlrb.prefetch`).

It serves repositories (a folder of files per model or dataset repository) with the
endpoints that huggingface_hub's `snapshot_download` and `datasets.load_dataset` call,
in the Hub's wire format, found by running them against it and reading what they asked:

- GET  /api/{models,datasets}/{repo}/revision/{rev}        repository info (commit `sha`, files)
- GET  /api/{models,datasets}/{repo}/tree/{rev}[/{path}]    file listing (`?recursive=true`)
- HEAD/GET /{repo}/resolve/{rev}/{file}, /datasets/{repo}/resolve/{rev}/{file}
  small files: 200 with X-Repo-Commit, ETag (the git blob id) and Content-Length;
  large files (as the Hub stores them with LFS): 302 with X-Linked-Etag and X-Linked-Size to
  /lfs/{sha256} on a second port (another origin, as the Hub's CDN is another host).

Every request is recorded (method, path) so tests can assert on what the libraries asked.
`fail[(kind, repo)] = status` makes every request about that repository answer `status`
as the Hub does (404: repository not found; else an error message).

`StandInHub.from_mirror(hf_home)` serves every repository that tests/hub_mirror.py wrote
into `hf_home` (the files of its snapshot), so a client with an empty cache downloads the
same stand-ins the offline tests read from the mirror.

Not served: xet storage (no file has an `xetHash`, so clients take the plain HTTP path),
authentication, gated repositories, rate limits, pagination (one page holds every entry),
the dataset viewer (`datasets` asks datasets-server.<host>, which does not resolve here,
and goes on without its parquet export's infos, as it does when the viewer has none).
"""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

COMMIT = "0123456789abcdef0123456789abcdef01234567"  # the commit `main` points to in every repository
# Files the Hub stores with LFS (as its default .gitattributes says): served by redirect.
LFS_SUFFIXES = (".safetensors", ".parquet", ".bin", ".msgpack", ".h5", ".model", ".arrow")

Repo = tuple[str, str]  # (kind: "model" or "dataset", repo id)


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class StandInHub:
    def __init__(self, repos: dict[Repo, Path], port: int = 0):
        self.files: dict[Repo, dict[str, bytes]] = {
            repo: {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
            for repo, root in repos.items()
        }  # fmt: skip
        self.fail: dict[Repo, int] = {}
        self.requests: list[tuple[str, str]] = []
        self.lock = threading.Lock()
        # The Hub, and its CDN for large files: another origin, as huggingface_hub follows a
        # redirect from /resolve only within the Hub and takes a file's metadata from the redirect.
        self.servers = [ThreadingHTTPServer(("127.0.0.1", p), self._handler_class()) for p in (port, 0)]
        for server in self.servers:
            server.daemon_threads = True
            threading.Thread(target=server.serve_forever, daemon=True).start()

    @classmethod
    def from_mirror(cls, hf_home: Path) -> StandInHub:
        """Serve every repository of a mirror written by tests/hub_mirror.py (its snapshot's files)."""
        repos: dict[Repo, Path] = {}
        for folder in sorted((Path(hf_home) / "hub").glob("*--*")):
            kind_plural, *name = folder.name.split("--")
            (snapshot,) = (folder / "snapshots").iterdir()
            repos[(kind_plural[:-1], "/".join(name))] = snapshot
        return cls(repos)

    @property
    def url(self) -> str:  # for HF_ENDPOINT
        return f"http://127.0.0.1:{self.servers[0].server_address[1]}"

    @property
    def cdn_url(self) -> str:
        return f"http://127.0.0.1:{self.servers[1].server_address[1]}"

    def close(self) -> None:
        for server in self.servers:
            server.shutdown()
            server.server_close()

    def __enter__(self) -> StandInHub:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- the Hub's answers -------------------------------------------------------------
    def entry(self, repo: Repo, path: str) -> dict | None:
        """The tree listing's entry of a file or folder, as the Hub writes it (None: no such path)."""
        files = self.files[repo]
        if path in files:
            data = files[path]
            out = {"type": "file", "oid": git_blob_id(data), "size": len(data), "path": path}
            if path.endswith(LFS_SUFFIXES):
                out["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
            return out
        if any(name.startswith(path + "/") for name in files):
            return {"type": "directory", "oid": git_blob_id(path.encode()), "size": 0, "path": path}
        return None

    def tree(self, repo: Repo, path: str, recursive: bool) -> list[dict] | None:
        prefix = f"{path}/" if path else ""
        if path and self.entry(repo, path) is None:
            return None
        below = {name[len(prefix) :] for name in self.files[repo] if name.startswith(prefix)}
        paths = set()
        for rest in below:
            parts = rest.split("/")
            depth = len(parts) if recursive else 1
            paths.update(prefix + "/".join(parts[: i + 1]) for i in range(depth))
        return [self.entry(repo, p) for p in sorted(paths)]

    def info(self, repo: Repo) -> dict:
        kind, repo_id = repo
        return {
            "_id": git_blob_id(repo_id.encode())[:24], "id": repo_id, "author": repo_id.split("/")[0],
            "sha": COMMIT, "lastModified": "2024-01-01T00:00:00.000Z", "private": False, "gated": False,
            "disabled": False, "downloads": 0, "likes": 0, "tags": [],
            "siblings": [{"rfilename": name} for name in sorted(self.files[repo])],
            **({"modelId": repo_id} if kind == "model" else {}),
        }  # fmt: skip

    def _handler_class(self):
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet: requests are in hub.requests
                pass

            def do_HEAD(self) -> None:
                self.answer(head=True)

            def do_GET(self) -> None:
                self.answer(head=False)

            def answer(self, head: bool) -> None:
                url = urlsplit(self.path)
                with hub.lock:
                    hub.requests.append((self.command, url.path))
                if url.path.startswith("/lfs/"):
                    sha = url.path[len("/lfs/") :]
                    data = next((d for files in hub.files.values() for d in files.values()
                                 if hashlib.sha256(d).hexdigest() == sha), None)  # fmt: skip
                    if data is None:
                        return self.error(404, "EntryNotFound", "no such object")
                    return self.send(200, data, "application/octet-stream", head=head)
                found = self.route(url.path)
                if found is None:
                    return self.error(404, "RepoNotFound", "Repository not found")
                repo, op, rev, path = found
                if repo in hub.fail:
                    status = hub.fail[repo]
                    if status == 404:
                        return self.error(404, "RepoNotFound", "Repository not found")
                    return self.error(status, "", "Internal Error")
                if rev not in ("main", COMMIT):
                    return self.error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
                if op == "revision":
                    return self.json(hub.info(repo), head)
                if op == "tree":
                    listing = hub.tree(repo, path, parse_qs(url.query).get("recursive") == ["true"])
                    if listing is None:
                        return self.error(404, "EntryNotFound", f'{path} does not exist on "{rev}"')
                    return self.json(listing, head)
                # resolve
                data = hub.files[repo].get(path)
                if data is None:
                    return self.error(404, "EntryNotFound", f'{path} does not exist on "{rev}"')
                headers = {"X-Repo-Commit": COMMIT}
                if path.endswith(LFS_SUFFIXES):
                    sha = hashlib.sha256(data).hexdigest()
                    headers.update({"X-Linked-Etag": f'"{sha}"', "X-Linked-Size": str(len(data)),
                                    "ETag": f'"{git_blob_id(data)}"',
                                    "Location": f"{hub.cdn_url}/lfs/{sha}"})  # fmt: skip
                    return self.send(302, b"", "text/plain", head=head, headers=headers)
                headers["ETag"] = f'"{git_blob_id(data)}"'
                return self.send(200, data, "application/octet-stream", head=head, headers=headers)

            def route(self, path: str) -> tuple[Repo, str, str, str] | None:
                """(repo, operation, revision, file path) of an /api/... or .../resolve/... path."""
                for kind, repo_id in hub.files:
                    plural = f"{kind}s"
                    for prefix, ops in (
                        (f"/api/{plural}/{repo_id}/", ("revision", "tree")),
                        (("/datasets/" if kind == "dataset" else "/") + f"{repo_id}/", ("resolve",)),
                    ):
                        if not path.startswith(prefix):
                            continue
                        op, _, rest = path[len(prefix) :].partition("/")
                        if op in ops:
                            rev, _, file_path = rest.partition("/")
                            return (kind, repo_id), op, unquote(rev), unquote(file_path)
                return None

            def json(self, value, head: bool) -> None:
                self.send(200, json.dumps(value).encode(), "application/json", head=head)

            def error(self, status: int, code: str, message: str) -> None:
                headers = {"X-Error-Code": code, "X-Error-Message": message} if code else {}
                body = json.dumps({"error": message}).encode()
                self.send(status, body, "application/json", head=self.command == "HEAD", headers=headers)

            def send(self, status: int, data: bytes, content_type: str, head: bool,
                     headers: dict[str, str] | None = None) -> None:  # fmt: skip
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.end_headers()
                if not head:
                    self.wfile.write(data)

        return Handler
