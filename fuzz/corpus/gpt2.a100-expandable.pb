
$
"

gpt2-small

layers
seq€J	a100-80gb`