
$
"

gpt2-small

layers
seq€hp