"""The static checker: file discovery, configuration, noqa, the rule registry, rules and fixes."""
