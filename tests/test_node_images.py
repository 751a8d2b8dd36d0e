"""The real node's image store (e2e/node) keeps one build of each image: older builds are
gigabytes each, and a machine that runs the suite often must not fill its disk with them."""

from __future__ import annotations

from repo_modules import node

HEADER = "REF TYPE DIGEST SIZE PLATFORMS LABELS\n"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def listing(*records: tuple[str, str]) -> str:
    return HEADER + "".join(
        f"{name} {MANIFEST} sha256:{digest} 2.9 GiB linux/amd64 io.cri-containerd.image=managed\n"
        for name, digest in records
    )


def test_an_import_removes_older_builds_and_the_ids_only_they_held():
    current = "localhost/pagoda-runtime:new"
    ls = listing(
        ("localhost/pagoda-operator:op1", "aa"),
        ("localhost/pagoda-runtime:old", "bb"),
        (current, "cc"),
        ("localhost/pagoda-runtime:upgrade-tag", "bb"),
        ("sha256:id-of-operator", "aa"),
        ("sha256:id-of-old-runtime", "bb"),
        ("sha256:id-of-new-runtime", "cc"),
        ("sha256:id-of-a-build-untagged-long-ago", "dd"),
    )

    stale = node.stale_images(ls, current)

    assert sorted(stale) == [
        "localhost/pagoda-runtime:old",
        "localhost/pagoda-runtime:upgrade-tag",
        "sha256:id-of-a-build-untagged-long-ago",
        "sha256:id-of-old-runtime",
    ]


def test_a_store_with_only_current_images_loses_nothing():
    ls = listing(
        ("localhost/pagoda-pause:p", "ee"),
        ("localhost/pagoda-runtime:new", "cc"),
        ("sha256:id-of-pause", "ee"),
        ("sha256:id-of-new-runtime", "cc"),
    )
    assert node.stale_images(ls, "localhost/pagoda-runtime:new") == []
    assert node.stale_images(HEADER, "localhost/pagoda-runtime:new") == []
