#!/usr/bin/env python3
"""Ask the machine's libpq how it parses connection strings.

Reads a JSON array of strings on stdin; prints a JSON array with, per string, either
{"ok": {keyword: value, ...}} (the options PQconninfoParse set, no defaults) or {"err": message}.
Used by tests/conninfo_libpq.rs to compare outboxd's parser with libpq's own.
"""
import ctypes
import ctypes.util
import json
import sys


class Option(ctypes.Structure):
    _fields_ = [
        ("keyword", ctypes.c_char_p),
        ("envvar", ctypes.c_char_p),
        ("compiled", ctypes.c_char_p),
        ("val", ctypes.c_char_p),
        ("label", ctypes.c_char_p),
        ("dispchar", ctypes.c_char_p),
        ("dispsize", ctypes.c_int),
    ]


def main():
    name = ctypes.util.find_library("pq") or "libpq.so.5"
    lib = ctypes.CDLL(name)
    lib.PQconninfoParse.restype = ctypes.POINTER(Option)
    lib.PQconninfoParse.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_char_p)]
    lib.PQconninfoFree.argtypes = [ctypes.POINTER(Option)]
    lib.PQlibVersion.restype = ctypes.c_int
    out = []
    for s in json.load(sys.stdin):
        err = ctypes.c_char_p()
        opts = lib.PQconninfoParse(s.encode(), ctypes.byref(err))
        if not opts:
            msg = err.value.decode(errors="replace").strip() if err.value else "(no message)"
            out.append({"err": msg})
            continue
        got = {}
        i = 0
        while opts[i].keyword is not None:
            if opts[i].val is not None:
                got[opts[i].keyword.decode()] = opts[i].val.decode(errors="replace")
            i += 1
        lib.PQconninfoFree(opts)
        out.append({"ok": got})
    json.dump({"version": lib.PQlibVersion(), "results": out}, sys.stdout)


main()
