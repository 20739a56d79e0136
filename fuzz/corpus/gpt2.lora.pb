
$
"

gpt2-small

layers
seq€!ªš™™™™™¹?"c_attn*lm_head