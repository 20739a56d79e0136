
$
"

gpt2-small

layers
seq€:transformer.h.1