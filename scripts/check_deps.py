#!/usr/bin/env python3
"""The dependency rule (docs/ARCHITECTURE.md, "What each module may include"), checked.

Reads the graph CMake writes at configure time (build/daisy_deps.json, cmake/DaisyDeps.cmake):
every target with its sources, the libraries it links and those it passes on (PUBLIC), and
the include/daisy headers each module owns (daisy_module's HEADERS). Then, for every
first-party C++ file:

  * a file compiled into targets may include daisy/X.h only when X.h belongs to a module
    those targets see: their own, the ones they link (PUBLIC or PRIVATE) and what those
    pass on PUBLIC, transitively -- the headers CMake's usage requirements would give them
    if each module had its own include directory;
  * a public header (include/daisy/X.h) may include only its own module's headers and
    those its module passes on (its PUBLIC links): its users get nothing else;
  * a header in a source folder is checked as part of the files of that folder that include
    it (or, when none does, as part of the folder's module);
  * every header in include/daisy has exactly one owner;
  * the modules' include edges and their links have no cycle.

Each failure names the file, the line and the edge (module -> module). Exit status 1 on any.

    scripts/check_deps.py build/daisy_deps.json [--exclude scripts/lint-exclude.txt]
    scripts/check_deps.py build/daisy_deps.json --table    (what each module may include)

With --exclude, the files that list names (files being rewritten elsewhere) are not checked.
"""

import json
import os
import re
import sys

FIRST_PARTY_DIRS = ("src", "apps", "tools", "bench", "fuzz", "tests", "include")
CXX_EXTENSIONS = (".cc", ".cpp", ".h", ".hpp")
SKIP_DIR_NAMES = {"node_modules", ".git", "fixture"}  # tests/deps/fixture: a tree of its own
INCLUDE_RE = re.compile(r'^\s*#\s*include\s*([<"])([^">]+)[">]')


def rel(root, path):
    return os.path.relpath(path, root)


def module_name(target):
    return target[len("daisy_"):] if target.startswith("daisy_") else target


class Graph:
    def __init__(self, path):
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        base = os.path.dirname(os.path.abspath(path))
        self.root = os.path.normpath(os.path.join(base, data["source_dir"]))
        self.include_dir = os.path.normpath(os.path.join(self.root, data["include_dir"]))
        self.targets = data["targets"]
        for t in self.targets.values():
            t["dir"] = os.path.normpath(os.path.join(self.root, t["dir"]))
            for key in ("sources", "include_dirs", "interface_include_dirs"):
                t[key] = [os.path.normpath(os.path.join(t["dir"], s)) for s in t.get(key, [])]
        self.modules = {name for name, t in self.targets.items() if t["module"]}
        self._exported = {}

    def deps(self, name, key):
        return [d for d in self.targets[name][key] if d in self.targets]

    def own(self, name):
        return set(self.targets[name]["headers"]) if name in self.modules else set()

    def exported(self, name, stack=()):
        """Headers a user of `name` gets: its own and what it passes on PUBLIC."""
        if name in self._exported:
            return self._exported[name]
        if name in stack:  # a link cycle; reported by link_cycles()
            return set()
        result = set(self.own(name))
        for d in self.deps(name, "exports"):
            result |= self.exported(d, stack + (name,))
        self._exported[name] = result
        return result

    def search_path(self, name):
        """Where a quoted include of a source of `name` is looked for (after its own folder)."""
        dirs, todo, seen = list(self.targets[name]["include_dirs"]), list(self.deps(name, "links")), set()
        while todo:  # bounded: each target once
            d = todo.pop()
            if d in seen:
                continue
            seen.add(d)
            dirs += self.targets[d]["interface_include_dirs"]
            todo += self.deps(d, "exports")
        return dirs

    def link_closure(self, name):
        """Every target `name` links, directly or not."""
        seen, todo = set(), list(self.deps(name, "links"))
        while todo:  # bounded: each target once
            d = todo.pop()
            if d not in seen:
                seen.add(d)
                todo += self.deps(d, "links")
        return seen

    def visible(self, name):
        """Headers the sources of `name` may include: its own and those of what it links."""
        result = set(self.own(name))
        for d in self.deps(name, "links"):
            result |= self.exported(d)
        return result


def find_cycle(edges):
    """One cycle of the directed graph {node: iterable of nodes}, as a node list, or None."""
    state = {}
    for start in sorted(edges):
        if start in state:
            continue
        path = [start]
        iters = [iter(sorted(edges.get(start, ())))]
        state[start] = "open"
        while iters:  # bounded: every node is opened and closed once
            nxt = next(iters[-1], None)
            if nxt is None:
                state[path.pop()] = "done"
                iters.pop()
                continue
            if state.get(nxt) == "open":
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                state[nxt] = "open"
                path.append(nxt)
                iters.append(iter(sorted(edges.get(nxt, ()))))
    return None


def first_party_files(root):
    for top in FIRST_PARTY_DIRS:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
            dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIR_NAMES)
            for f in sorted(filenames):
                if f.endswith(CXX_EXTENSIONS):
                    yield os.path.join(dirpath, f)


def read_includes(path):
    """(line number, '<' or '"', name) for each #include of the file."""
    result = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            m = INCLUDE_RE.match(line)
            if m:
                result.append((number, m.group(1), m.group(2)))
    return result


def read_exclusions(path):
    """Paths (relative to the source folder; a trailing / for a folder) left unchecked."""
    if not path:
        return []
    with open(path, encoding="utf-8") as f:
        return [line.strip() for line in f if line.strip() and not line.startswith("#")]


def check(graph_path, exclude_path=None, out=sys.stdout):
    g = Graph(graph_path)
    root = g.root
    errors = []
    patterns = read_exclusions(exclude_path)

    # Ownership: every header of include/daisy declared by exactly one module.
    owners = {}
    for m in sorted(g.modules):
        for h in g.targets[m]["headers"]:
            owners.setdefault(h, []).append(m)
            if not os.path.isfile(os.path.join(g.include_dir, h)):
                errors.append(f"{rel(root, g.targets[m]['dir'])}/CMakeLists.txt: module {module_name(m)} declares "
                              f"HEADERS {h}, but {rel(root, os.path.join(g.include_dir, h))} does not exist")
    for h, ms in sorted(owners.items()):
        if len(ms) > 1:
            errors.append(f"{rel(root, os.path.join(g.include_dir, h))}: owned by more than one module "
                          f"({', '.join(module_name(m) for m in ms)}); exactly one daisy_module may list it in HEADERS")
    if os.path.isdir(g.include_dir):
        for f in sorted(os.listdir(g.include_dir)):
            if f.endswith(CXX_EXTENSIONS) and f not in owners:
                errors.append(f"{rel(root, os.path.join(g.include_dir, f))}: no module owns it; add it to the "
                              f"HEADERS of one daisy_module call")
    owner = {h: ms[0] for h, ms in owners.items()}

    # Cycles in the links themselves (static libraries may link each other both ways).
    link_edges = {t: set(g.deps(t, "links")) for t in g.targets}
    cycle = find_cycle(link_edges)
    if cycle:
        where = ", ".join(f"{rel(root, g.targets[t]['dir'])}/CMakeLists.txt" for t in cycle[:-1])
        errors.append(f"link cycle: {' -> '.join(cycle)} (declared in {where})")

    # Which targets compile each file.
    compiled_by = {}
    for name, t in g.targets.items():
        for s in t["sources"]:
            compiled_by.setdefault(s, []).append(name)

    files = list(first_party_files(root))
    # Files being rewritten elsewhere (scripts/lint-exclude.txt): their includes are not
    # checked, and they give no edges; they still own their headers.
    excluded = {rel(root, f) for f in files
                if any(rel(root, f) == p or (p.endswith("/") and rel(root, f).startswith(p)) for p in patterns)}
    includes = {f: read_includes(f) for f in files}

    # A header of a source folder takes the targets of the files that include it (found next
    # to the includer or on its targets' include paths), to a fixpoint: headers include headers.
    contexts = {f: set(compiled_by[f]) for f in files if f in compiled_by}
    search = {t: g.search_path(t) for t in g.targets}
    public = g.include_dir + os.sep

    def resolve(f, name, targets):
        for d in [os.path.dirname(f)] + [p for t in sorted(targets) for p in search[t]]:
            h = os.path.normpath(os.path.join(d, name))
            if h in includes:
                return h
        return None

    for _ in range(len(files) + 1):  # bounded: each round adds at least one target or stops
        changed = False
        for f, incs in includes.items():
            if f not in contexts:
                continue
            for _, kind, name in incs:
                h = resolve(f, name, contexts[f]) if kind == '"' and not name.startswith("daisy/") else None
                if h and not h.startswith(public):
                    before = len(contexts.get(h, ()))
                    contexts.setdefault(h, set()).update(contexts[f])
                    changed |= len(contexts[h]) != before
        if not changed:
            break
    module_by_dir = {g.targets[m]["dir"]: m for m in g.modules}
    skipped = []
    for f in files:
        if f not in contexts and not f.startswith(public):
            m = module_by_dir.get(os.path.dirname(f))
            if m:  # e.g. another ISA's kernel file, not compiled on this machine
                contexts[f] = {m}
            else:
                skipped.append(f)

    # The rule, file by file; the module-level include edges for the cycle check.
    module_edges = {}
    witness = {}
    checked = 0
    for f in files:
        if f.startswith(public):
            h = os.path.basename(f)
            if h not in owner:
                continue
            ctx, allowed = [owner[h]], g.exported(owner[h])
            why = f"{owner[h]} does not pass {{to}} on to its users (a PUBLIC link); it passes on"
        elif f in contexts:
            ctx = sorted(contexts[f])
            allowed = set.intersection(*(g.visible(t) for t in ctx))
            why = f"{' and '.join(ctx)} {'do' if len(ctx) > 1 else 'does'} not link {{to}}; it sees"
        else:
            continue
        checked += rel(root, f) not in excluded
        mods = [t for t in ctx if t in g.modules]
        from_mod = mods[0] if len(mods) == 1 else None
        from_name = module_name(from_mod) if from_mod else ctx[0]
        for line, _, name in includes[f]:
            if not name.startswith("daisy/") or rel(root, f) in excluded:
                continue
            h = name[len("daisy/"):]
            loc = f"{rel(root, f)}:{line}"
            if h not in owner:
                errors.append(f"{loc}: includes {name}, which no module owns (no such header, or not in any HEADERS)")
                continue
            to_mod = owner[h]
            if h not in allowed:
                sees = sorted({module_name(owner[x]) for x in allowed if x in owner})
                # A back edge points at a module that itself depends on this one.
                back = from_mod is not None and from_mod in g.link_closure(to_mod)
                errors.append(f"{loc}: {'back' if back else 'undeclared'} edge {from_name} -> "
                              f"{module_name(to_mod)}: includes {name}, but "
                              f"{why.format(to=to_mod)}: {', '.join(sees) or 'nothing'}")
            if from_mod and to_mod != from_mod:
                module_edges.setdefault(from_mod, set()).add(to_mod)
                witness.setdefault((from_mod, to_mod), loc + f" ({name})")

    cycle = find_cycle(module_edges)
    if cycle:
        steps = "; ".join(f"{witness[(a, b)]}: {module_name(a)} -> {module_name(b)}" for a, b in zip(cycle, cycle[1:]))
        errors.append(f"include cycle {' -> '.join(module_name(m) for m in cycle)}: {steps}")

    for e in errors:
        print(f"deps_rule: {e}", file=out)
    for f in skipped:
        print(f"deps_rule: note: {rel(root, f)} is in no target of this configuration; not checked", file=out)
    edges = sum(len(v) for v in module_edges.values())
    if excluded:
        print(f"deps_rule: note: {len(excluded)} files not checked, as {rel(root, exclude_path)} says", file=out)
    print(f"deps_rule: {checked} files, {len(g.modules)} modules, {edges} module edges, "
          f"{len(owner)} headers: "
          f"{'FAILED, ' + str(len(errors)) + ' error(s)' if errors else 'OK'}", file=out)
    return 1 if errors else 0


def table(graph_path, out=sys.stdout):
    """The rule as a Markdown table: each module's headers, what it may include, what its
    users get with it (docs/ARCHITECTURE.md)."""
    g = Graph(graph_path)

    def names(headers, but):
        return ", ".join(sorted(module_name(m) for m in g.modules if m != but and g.own(m) & headers)) or "-"

    print("| module | owns (include/daisy) | may include, besides its own | passes on to its users |", file=out)
    print("|---|---|---|---|", file=out)
    order = sorted(g.modules, key=lambda m: (len(g.link_closure(m)), m))  # lower layers first
    for m in order:
        print(f"| `{module_name(m)}` | {', '.join(sorted(g.own(m)))} | {names(g.visible(m), m)} | "
              f"{names(g.exported(m), m)} |", file=out)
    return 0


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("graph", help="daisy_deps.json, as CMake writes it into the build folder")
    parser.add_argument("--exclude", help="a file of paths not to check (scripts/lint-exclude.txt)")
    parser.add_argument("--table", action="store_true", help="print what each module may include, check nothing")
    args = parser.parse_args()
    sys.exit(table(args.graph) if args.table else check(args.graph, args.exclude or None))
