#!/usr/bin/env python3
"""bench/fetch_snapshots.py: download the public PyTorch memory snapshots of bench/snapshots.txt.

    python3 bench/fetch_snapshots.py DIR [--list bench/snapshots.txt]
                                         [--base https://raw.githubusercontent.com]

Each line of the list names a repository, a commit, a path and the git blob SHA-1 of the file.
The file is fetched from BASE/OWNER/REPO/COMMIT/PATH into DIR as OWNER+REPO__PATH (slashes of
the path as underscores), and kept only if its blob SHA-1 matches: the bytes checked are the
bytes that were committed. Files already in DIR with the right hash are not fetched again.
Then: python3 bench/snapshot_check.py DIR/* (docs/pytorch_model.md).

Exits 0 when every file is in DIR, 1 when some could not be fetched or did not match (each
named on stderr with the reason), 2 on a malformed list (file, line and reason).
"""
import argparse
import hashlib
import os
import sys
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))


def blob_sha1(data):
    """git hash-object of data."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def read_list(path):
    """[(repo, commit, file path, sha1)]; ValueError 'FILE:LINE: reason' if malformed."""
    items = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            fields = line.split()
            if len(fields) != 5:
                raise ValueError("%s:%d: expected 'owner/repo commit path sha1 size'" % (path, n))
            repo, commit, rel, sha, _ = fields
            if repo.count("/") != 1 or len(sha) != 40 or ".." in rel.split("/"):
                raise ValueError("%s:%d: bad repository, path or sha1" % (path, n))
            items.append((repo, commit, rel, sha))
    return items


def local_name(repo, rel):
    return "%s__%s" % (repo.replace("/", "+"), rel.replace("/", "_"))


def fetch(base, item, out_dir):
    """None when the file is in out_dir with the right hash, else the reason it is not."""
    repo, commit, rel, sha = item
    dest = os.path.join(out_dir, local_name(repo, rel))
    if os.path.exists(dest):
        with open(dest, "rb") as f:
            if blob_sha1(f.read()) == sha:
                return None
    url = "%s/%s/%s/%s" % (base.rstrip("/"), repo, commit, rel)
    try:
        with urllib.request.urlopen(url, timeout=60) as r:
            data = r.read()
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return "%s: %s" % (url, exc)
    if blob_sha1(data) != sha:
        return "%s: blob sha1 %s, expected %s" % (url, blob_sha1(data), sha)
    with open(dest, "wb") as f:
        f.write(data)
    return None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--list", default=os.path.join(HERE, "snapshots.txt"))
    ap.add_argument("--base", default="https://raw.githubusercontent.com")
    args = ap.parse_args(argv)
    try:
        items = read_list(args.list)
    except (OSError, ValueError) as exc:
        print("fetch_snapshots: %s" % exc, file=sys.stderr)
        return 2
    os.makedirs(args.dir, exist_ok=True)
    failed = 0
    for item in items:
        why = fetch(args.base, item, args.dir)
        if why:
            failed += 1
            print("fetch_snapshots: %s" % why, file=sys.stderr)
    print("%d of %d snapshots in %s" % (len(items) - failed, len(items), args.dir))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
