"""Lifecycle: objects nobody reads move to colder, cheaper tiers; reads through LOTA count.

A cache hides reads from the origin, so LOTA records the reads and writes it serves
(:mod:`~lota.lifecycle.access`) and drives tiering itself. The parts, by concern:

- :mod:`~lota.lifecycle.rules`   tiers, rules and :func:`~lota.lifecycle.rules.plan` (no I/O)
- :mod:`~lota.lifecycle.config`  the ``[lifecycle]`` config section
- :mod:`~lota.lifecycle.state`   the rules in force, replaceable at runtime (admin call)
- :mod:`~lota.lifecycle.access`  :class:`AccessRecorder`: batched last-access times
- :mod:`~lota.lifecycle.engine`  :class:`Engine`: list, plan, copy in place, under a lease
- :mod:`~lota.lifecycle.cli`     ``lota lifecycle plan`` and ``lota lifecycle run``

:mod:`lota.config` imports ``config`` (and through it ``rules``); they import nothing of
the configuration but :mod:`lota.settings`, so there is no cycle to dodge.
"""
