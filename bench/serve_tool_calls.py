# serve_tool_calls.py BASE_URL N - N required or named tool-call requests (seeds 0..N-1,
# temperature 1, parallel calls on every third) against an OpenAI-compatible
# server; counts the replies whose calls all parse and validate against
# the functions' parameter schemas.
import json, sys, urllib.request
base = sys.argv[1]
tools = [{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string","maxLength":20},"unit":{"type":"string","enum":["c","f"]},"days":{"type":"integer","minimum":1,"maximum":7}},"required":["city","unit"],"additionalProperties":False}}},
         {"type":"function","function":{"name":"search","parameters":{"type":"object","properties":{"q":{"type":"string","maxLength":30},"limit":{"type":"integer","minimum":1,"maximum":10}},"required":["q"],"additionalProperties":False}}}]
def valid(name, a):
    if name == "get_weather":
        return set(a) <= {"city","unit","days"} and {"city","unit"} <= set(a) and isinstance(a["city"], str) and len(a["city"]) <= 20 and a["unit"] in ("c","f") and ("days" not in a or (type(a["days"]) is int and 1 <= a["days"] <= 7))
    if name == "search":
        return set(a) <= {"q","limit"} and "q" in a and isinstance(a["q"], str) and len(a["q"]) <= 30 and ("limit" not in a or (type(a["limit"]) is int and 1 <= a["limit"] <= 10))
    return False
n = ok = calls = 0
for seed in range(int(sys.argv[2])):
    choice = "required" if seed % 2 == 0 else {"type":"function","function":{"name":"search"}}
    body = {"messages":[{"role":"user","content":"Help me"}],"tools":tools,"tool_choice":choice,"seed":seed,"max_tokens":1500,"temperature":1,"parallel_tool_calls": seed % 3 == 0}
    req = urllib.request.Request(base + "/v1/chat/completions", json.dumps(body).encode(), {"Content-Type":"application/json"})
    d = json.load(urllib.request.urlopen(req))
    m = d["choices"][0]["message"]
    n += 1
    good = d["choices"][0]["finish_reason"] == "tool_calls" and m.get("tool_calls")
    for tc in m.get("tool_calls") or []:
        calls += 1
        try:
            a = json.loads(tc["function"]["arguments"])
        except Exception:
            good = False; continue
        if not valid(tc["function"]["name"], a) or (isinstance(choice, dict) and tc["function"]["name"] != "search"):
            good = False
    ok += bool(good)
    if not good:
        print("BAD", seed, json.dumps(d)[:400])
print(f"{ok}/{n} requests with tool calls that parse and validate ({calls} calls)")
