"""Security properties of reading: nothing written outside the cache folder."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import Dataset, image_bytes
from tests.hostile.corpus import HEAD, TAIL, member

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

# Every recipe and a chain, with 2 forked DataLoader workers, over good and hostile shards
READ_ALL = """
import sys, warnings
from torch.utils.data import DataLoader
import shardpipes as sp

shards, images, cache = sys.argv[1:4]
warnings.simplefilter("ignore")

def drain(pipe, workers=2):
    return sum(1 for _ in DataLoader(pipe, batch_size=None, num_workers=workers))

total = drain(sp.recipes.tar_shards(shards + "/*.tar", fields=("txt;png", "__key__"),
                                    handler="warn", cache_dir=cache, cache_size="10MB"))
total += drain(sp.recipes.tar_images(shards + "/train-000000.tar", handler="warn"))
total += drain(sp.recipes.indexed_tar(shards + "/train-000001.tar"))
total += drain(sp.recipes.image_folder(images))
total += drain(
    sp.list_shards(shards + "/*.tar").split_shards().open_tar(handler="warn").decode(handler="warn")
)
print(total)
"""


def snapshot(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def test_reading_writes_nothing_outside_the_cache(
    tmp_path: Path, make_shards: Callable[..., Dataset]
) -> None:
    """Reading writes nothing outside the cache folder.

    Recipes run in a read-only working directory with an empty HOME and TMPDIR; after
    reading good and hostile shards (``../`` and absolute member names), the only new files
    are in the cache folder.
    """
    data = make_shards(2, 8, images=True)
    shards = Path(data.urls[0]).parent
    hostile = member("../escape.txt", b"x") + member("/tmp/abs.txt", b"y")
    (shards / "hostile.tar").write_bytes(HEAD + hostile + TAIL)
    images = tmp_path / "images"
    for label in range(2):
        (images / f"c{label}").mkdir(parents=True)
        for i in range(3):
            (images / f"c{label}" / f"{i}.png").write_bytes(image_bytes(label, i))
    cwd, home, tmp, cache = (tmp_path / name for name in ("cwd", "home", "tmp", "cache"))
    for folder in (cwd, home, tmp, cache):
        folder.mkdir()
    before = snapshot(tmp_path)
    cwd.chmod(stat.S_IRUSR | stat.S_IXUSR)
    env = {**os.environ, "HOME": str(home), "TMPDIR": str(tmp), "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("XDG_CACHE_HOME", None)
    try:
        result = subprocess.run(
            [sys.executable, "-c", READ_ALL, str(shards), str(images), str(cache)],
            cwd=cwd, env=env, capture_output=True, text=True, timeout=150, check=False,
        )  # fmt: skip
    finally:
        cwd.chmod(stat.S_IRWXU)
    assert result.returncode == 0, result.stderr[-3000:]
    assert int(result.stdout) > 0
    new = snapshot(tmp_path) - before
    assert all(path.startswith("cache") for path in new), sorted(new)
    assert not (tmp_path / "escape.txt").exists()
