import ast

from ddpdoctor.check.keyword_gates import KeywordGate, keyword_gate


def _decorator(text: str) -> ast.FunctionDef:
    node = ast.parse(text).body[0]
    assert isinstance(node, ast.FunctionDef)
    return node


def _call(text: str) -> ast.Call:
    node = ast.parse(text, mode="eval").body
    assert isinstance(node, ast.Call)
    return node


def test_wrapper_calling_under_a_keyword_test():
    assert keyword_gate(_decorator(
        "def only(fn):\n"
        "    def wrapper(*args, **kwargs):\n"
        "        if kwargs.get('leader', True):\n"
        "            return fn(*args, **kwargs)\n"
        "    return wrapper\n")) == ("leader", True)


def test_wrapper_leaving_early_when_the_keyword_is_false():
    assert keyword_gate(_decorator(
        "def only(fn):\n"
        "    def wrapper(*args, **options):\n"
        "        if not options.get('leader', False):\n"
        "            return None\n"
        "        return fn(*args, **options)\n"
        "    return wrapper\n")) == ("leader", False)


def test_wrapper_that_also_calls_outside_the_test_is_no_gate():
    assert keyword_gate(_decorator(
        "def only(fn):\n"
        "    def wrapper(*args, **kwargs):\n"
        "        if kwargs.get('leader', True):\n"
        "            fn(*args, **kwargs)\n"
        "        return fn(*args, **kwargs)\n"
        "    return wrapper\n")) is None


def test_each_call_binds_the_keyword():
    gate = KeywordGate("only", "leader", True)
    assert gate.runs(_call("self.store(step, self.leader)")) is True  # by position: the default
    assert gate.runs(_call("self.store(step, leader=self.leader)")) is None  # the value decides
    assert gate.runs(_call("self.store(step, leader=False)")) is False
    assert gate.runs(_call("self.store(step, **options)")) is None
    assert KeywordGate("only", "leader", False).runs(_call("store(step)")) is False
