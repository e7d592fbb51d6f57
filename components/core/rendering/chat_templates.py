"""Chat templates we write: ChatML with Hermes tool calls (the tiny default model's, Qwen-style) and
Llama 3 with JSON tool calls. A checkpoint's own template is always used when it has one; these are
for tokenizers we build (the tiny model, tests) and for checkpoints that ship none.

The ChatML tool block lists each function as one line, `- name(arg, ...): description` (Qwen's own template
dumps the full JSON schemas; a compact list keeps the tiny model's CPU sequences short). Both render every
message the same way whether or not it is the last one (append-only, see
`rendering`), take OpenAI-style `tools` and assistant `tool_calls` (arguments as a dict), and render
`tool` messages as the model family does (ChatML: a user turn of `<tool_response>`; Llama 3: `ipython`).
"""

from __future__ import annotations

CHATML_TOOLS = (
    "{%- set ns = namespace(system='') -%}"
    "{%- if messages and messages[0].role == 'system' %}{%- set ns.system = messages[0].content %}{%- endif %}"
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}{%- if ns.system %}{{- ns.system + '\\n\\n' }}{%- endif %}"
    '{{- \'# Tools\\nCall one function per reply as <tool_call>\\n{"name": <function-name>, "arguments": '
    "<args-json-object>}\\n</tool_call>. Functions:' }}"
    "{%- for tool in tools %}{%- set f = tool.get('function', tool) %}"
    "{{- '\\n- ' + f.name + '(' + (f.get('parameters', {}).get('properties', {}) | list | join(', ')) + '): '"
    " + f.get('description', '') }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif ns.system %}{{- '<|im_start|>system\\n' + ns.system + '<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' and loop.first %}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' + (message.content or '') }}"
    "{%- for call in message.tool_calls or [] %}"
    "{%- if message.content or not loop.first %}{{- '\\n' }}{%- endif %}"
    '{{- \'<tool_call>\\n{"name": "\' + call.function.name + \'", "arguments": \' '
    "+ (call.function.arguments | tojson) + '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
CHATML_SPECIAL_TOKENS = ["<|im_start|>", "<|im_end|>"]
CHATML_TOOL_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]

LLAMA3_TOOLS = (
    "{{- bos_token }}"
    "{%- set ns = namespace(system='') -%}"
    "{%- if messages and messages[0].role == 'system' %}{%- set ns.system = messages[0].content %}{%- endif %}"
    "{%- if ns.system or tools %}"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' + ns.system }}"
    "{%- if tools %}"
    "{{- '\\n\\nYou have access to the following functions. To call a function, respond with JSON of the form "
    '{"name": function name, "parameters": dictionary of argument name and its value}.\\n\' }}'
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{%- endif %}"
    "{{- '<|eot_id|>' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' and loop.first %}"
    "{%- elif message.role == 'assistant' and message.tool_calls %}"
    "{%- set call = message.tool_calls[0].function %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{{- '{\"name\": \"' + call.name + '\", \"parameters\": ' + (call.arguments | tojson) + '}<|eot_id|>' }}"
    "{%- elif message.role == 'tool' %}"
    "{{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' + message.content + '<|eot_id|>' }}"
    "{%- else %}"
    "{{- '<|start_header_id|>' + message.role + '<|end_header_id|>\\n\\n' + message.content + '<|eot_id|>' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)
LLAMA3_SPECIAL_TOKENS = [
    "<|begin_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|python_tag|>",
]
