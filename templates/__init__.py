"""The package templates that ``envhub init`` renders, installed as ``envhub.templates``.

Each folder (single-turn, multi-turn, tool, code) is a whole env package. Files ending in
``.tmpl`` have their ``{{name}}``-style placeholders filled in and lose the suffix, and the
``__module__`` folder takes the package's module name; see :mod:`envhub.scaffold`.
"""
