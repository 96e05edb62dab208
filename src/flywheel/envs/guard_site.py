"""The grading guard that runs inside the test process: proofs of completed tests, signed with a key no code
under test can read.

Grading (envs/guard.py) writes this file as `sitecustomize.py` into a directory with a random name, next to a
`guard.txt` holding a fresh key, a nonce and the module name (one per line), and puts that directory first on
PYTHONPATH. Python imports
`sitecustomize` while it starts, before pytest or runtests.py and before any file of the workspace, so:

1. the key is read and both files are deleted before code under test can exist (the key then lives only in a
   keyed BLAKE2 object inside closures; the module that exposes them is registered under the nonce's name);
2. an `alive` record is signed at once: its absence means the test command did not start Python the usual way;
3. every test file grading runs ends with `wrap(globals(), "<path>")`, which wraps each `test*` function (module
   level and in the file's classes): only when the real test body returns does the wrapper append a signed
   proof `(seq, file, name)` to the proof file. A runner patched to skip tests, a forged JUnit report or a
   replaced `__code__` leaves a "passed" without a proof, which grading treats as tampering.

Code under test can still truncate the proof file (every test then fails) or hunt the key through
introspection (frames, gc, closures): grading flags those constructs statically (envs/integrity.py).
Standard library only: it runs with the sandbox's Python, where flywheel is not installed. It imports only
`_blake2` (a built-in C module; `hmac`, `hashlib` and `json` would load OpenSSL and `re` at every start of the
test process, which doubled what the guard cost a `runtests.py` grading).
"""

import _blake2
import os
import sys


def _install() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    config_path = os.path.join(here, "guard.txt")
    try:
        with open(config_path, encoding="utf-8") as f:
            key_hex, nonce, module_name = f.read().split()
    except (OSError, ValueError):  # a child process after the first one: the key is gone, so no proofs from here
        return
    for path in (config_path, os.path.abspath(__file__)):
        try:
            os.unlink(path)
        except OSError:
            pass
    mac = _blake2.blake2b(key=bytes.fromhex(key_hex), digest_size=32)
    fd = os.open(os.path.join(here, "proofs"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    seq = [0]
    write, getpid = os.write, os.getpid  # bound now: code under test may later replace os.write
    pid = getpid()
    module = type(sys)(module_name)

    def sign(file: str, name: str) -> None:
        if getpid() != pid:  # a forked child would write proofs for tests the runner did not see
            return
        seq[0] += 1
        m = mac.copy()
        m.update(f"{nonce}\0{seq[0]}\0{file}\0{name}".encode())
        write(fd, f"{seq[0]}\t{file}\t{name}\t{m.hexdigest()}\n".encode())

    def wrapped(fn, file: str):
        code = fn.__code__
        if code.co_flags & 0x80:  # CO_COROUTINE: the proof waits for the awaited body

            async def proof_async(*args, **kwargs):
                if fn.__code__ is not code:
                    raise AssertionError("flywheel grading: a test function's code was replaced")
                result = await fn(*args, **kwargs)
                sign(file, fn.__name__)
                return result

            runner = proof_async
        else:

            def proof(*args, **kwargs):
                if fn.__code__ is not code:
                    raise AssertionError("flywheel grading: a test function's code was replaced")
                result = fn(*args, **kwargs)
                sign(file, fn.__name__)
                return result

            runner = proof
        for attr in ("__module__", "__name__", "__qualname__", "__doc__"):
            setattr(runner, attr, getattr(fn, attr))
        runner.__dict__.update(fn.__dict__)  # pytest marks, mock.patch's patchings
        runner.__wrapped__ = fn  # type: ignore[attr-defined]  # pytest reads the fixtures from the wrapped signature
        return runner

    def wrap_class(cls, file: str, seen: set) -> None:
        if id(cls) in seen:
            return
        seen.add(id(cls))
        for name, value in list(vars(cls).items()):
            if name.startswith("test") and type(value) is type(wrap_class):
                setattr(cls, name, wrapped(value, file))
            elif isinstance(value, type) and value.__module__ == cls.__module__:
                wrap_class(value, file, seen)

    def wrap(namespace: dict, file: str) -> None:
        """Wrap every `test*` function in the module `namespace` and every `test*` method of the classes it
        defines. An imported function is wrapped too: the runner collects it under this file's name (funcy's
        tests import a newer `test_decorator_access_args` over the one they define), and grading restores the
        test directory it comes from (envs/reward.py). Imported classes are not: they are shared objects."""
        module_name, seen = namespace.get("__name__"), set[int]()
        for name, value in list(namespace.items()):
            if name.startswith("test") and type(value) is type(wrap):
                namespace[name] = wrapped(value, file)
            elif isinstance(value, type) and value.__module__ == module_name:
                wrap_class(value, file, seen)

    root = os.getcwd() + os.sep
    test_suffixes = ("_test.py",)

    class _Probe:  # equal to nothing but itself
        __slots__ = ()

    def suspicious(value) -> bool:
        """An object of a class the workspace's non-test code defines that equals a fresh, private value."""
        cls = type(value)
        mod = sys.modules.get(getattr(cls, "__module__", None) or "")
        path = os.path.abspath(getattr(mod, "__file__", None) or "/")
        name = os.path.basename(path)
        if not path.startswith(root) or name.startswith("test_") or name.endswith(test_suffixes) \
                or name == "conftest.py":
            return False
        bits = int.from_bytes(os.urandom(8), "big")
        for other in (_Probe(), bits + 7, f"fw-{bits:x}", bits / 3.0 + 0.5):
            try:
                if value == other:
                    return True
            except Exception:  # noqa: BLE001 - a class that refuses the comparison is not always-equal
                pass
        return False

    def probe(value, depth: int = 0):
        """`value` unchanged; signs an `<always-equal>` record when it (or an item of it) equals anything."""
        items = [value]
        if depth < 3 and type(value) in (list, tuple, set, frozenset):
            items += list(value)[:256]
        elif depth < 3 and type(value) is dict:
            items += list(value.values())[:256]
        for item in items:
            if item is value:
                if suspicious(value):
                    sign("", "<always-equal>")
            else:
                probe(item, depth + 1)
        return value

    module.wrap = wrap  # type: ignore[attr-defined]
    module.probe = probe  # type: ignore[attr-defined]
    sys.modules[module_name] = module
    sign("", "<alive>")


_install()
del _install
