# Reports where `mooncake.store` and `mooncake.engine` come from, here and in a spawned child.
import json
import multiprocessing
import subprocess
import sys


def origins():
    import mooncake.store

    out = {"store": mooncake.store.__file__, "class": mooncake.store.MooncakeDistributedStore.__module__}
    try:
        import mooncake.engine

        out["engine"] = mooncake.engine.__file__
    except ImportError as exc:
        out["engine"] = f"ImportError: {exc}"
    return out


def child(queue):
    queue.put(origins())


if __name__ == "__main__":
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=child, args=(queue,))
    proc.start()
    spawned = queue.get(timeout=120)
    proc.join()
    sub = subprocess.run(
        [sys.executable, "-c", "import mooncake.store as s; print(s.__file__)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    print(
        "ORIGINS "
        + json.dumps({"main": origins(), "spawned": spawned, "subprocess": sub, "argv": sys.argv, "name": __name__})
    )
