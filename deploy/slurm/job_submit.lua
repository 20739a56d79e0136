--[[
memest's job-submission hook for Slurm (JobSubmitPlugins=lua; docs/slurm.md).

A job that describes its model in its comment,

  sbatch --gres=gpu:h100:4 --comment "memest: --preset llama-70b --seq 4096 --batch 64 --precision bf16" train.sh

(or, for sbatch, in its environment: MEMEST_ARGS="--hf-config /models/llama/config.json ...")
is checked when it is submitted: memest plans the training over the GPUs it asks for, and

  - when some split of the model over those GPUs fits, the job is accepted, and the user is told
    the split ("memest: fits 4 x h100-80gb: dp x tp x pp 4 x 1 x 1 fsdp2, ...");
  - when none fits, the job is refused with why and what would fit ("... the fewest that fit:
    8 x h100-80gb: ...; resubmit with --gres=gpu:h100:8");
  - when it asks for no GPUs, the fewest that fit are filled in (--gres on one node, or a job's
    GPU count beyond it).

With --mode inference in the flags, the job is estimated as given (its parallelism in the flags)
on one GPU of the type asked for. A job without "memest:" in its comment nor MEMEST_ARGS is left
alone. The flags are memest's own (memest plan --help); the hook adds the device, the GPU
count and the server, and refuses flags that would change where memest runs or what it reads
for credentials.

Put this file beside slurm.conf, and memest_config.lua beside it to change the settings below
(it returns a table with any of them). The hook runs in slurmctld, as SlurmUser, which must be
able to run `memest` and read any file the flags name.
]]

local config = {
  memest = "/usr/local/bin/memest",  -- the memest CLI
  server = "127.0.0.1:50051",        -- memest-server HOST:PORT, or "local": the engine in-process
  extra_args = {},                   -- e.g. {"--auth-token-file", "/etc/memest/token", "--tls"}
  -- Slurm's GPU types (gres.conf Type=) to memest's devices (memest devices).
  devices = {
    a100 = "a100-80gb", a100_40g = "a100-40gb", a100_80g = "a100-80gb",
    h100 = "h100-80gb", h100_nvl = "h100-nvl", h200 = "h200-141gb", b200 = "b200",
    l4 = "l4", l40 = "l40", l40s = "l40s", a10g = "a10g", t4 = "t4", v100 = "v100-32gb",
  },
  default_type = "h100",  -- the GPU type of a job that names none
  gpus_per_node = 8,      -- more than this and a filled-in job asks for GPUs per job, not per node
  max_gpus = 64,          -- the most GPUs memest looks at to say what would fit
  -- Directories whose files the flags may name (--hf-config, --model, --lora-config): memest
  -- reads them as SlurmUser, so any other path is refused.
  model_dirs = {},
  timeout_seconds = 30,   -- one memest call; the hook holds the submission meanwhile
  fail_open = true,       -- memest unreachable or failing: accept the job (and say so), or refuse
}

local ESLURM_INVALID_GRES = 2072  -- "Invalid generic resource (gres) specification"

-- Flags the hook sets itself, or that would change where memest runs or what it reads.
local RESERVED = {
  ["--server"] = true, ["--local"] = true, ["--auth-token-file"] = true, ["--tls"] = true,
  ["--tls-ca"] = true, ["--tls-cert"] = true, ["--tls-key"] = true, ["--tls-server-name"] = true,
  ["--json"] = true, ["--deadline-ms"] = true, ["--device"] = true, ["--devices"] = true,
  ["--gpus"] = true, ["--max-plans"] = true, ["--brief"] = true, ["--help"] = true, ["-h"] = true,
}

-- Flags whose value is a file memest reads (as SlurmUser): allowed under config.model_dirs only.
local FILE_FLAGS = { ["--model"] = true, ["--hf-config"] = true, ["--lora-config"] = true }

local function load_overrides()
  local source = debug.getinfo(1, "S").source
  local dir = source:match("^@(.*)/[^/]*$") or "/etc/slurm"
  local chunk = loadfile(dir .. "/memest_config.lua")
  if chunk == nil then return end
  local ok, overrides = pcall(chunk)
  if ok and type(overrides) == "table" then
    for key, value in pairs(overrides) do config[key] = value end
  else
    slurm.log_error("memest: %s/memest_config.lua: %s", dir, tostring(overrides))
  end
end
load_overrides()

local function gpus_word(n)
  return n == 1 and "1 GPU" or (n .. " GPUs")
end

-- memest's last line of output, without its own "memest: " prefix.
local function last_line(output)
  return (output:match("[^\n]*$"):gsub("^memest: ", ""))
end

local function quote(word)
  return "'" .. word:gsub("'", "'\\''") .. "'"
end

-- The canonical path of an existing file or directory, or nil.
local function real_path(path)
  local pipe = io.popen("realpath -e -- " .. quote(path) .. " 2>/dev/null")
  local real = pipe:read("*l")
  pipe:close()
  return real
end

local function under_model_dirs(path)
  local real = real_path(path)
  if real == nil then return false end
  for _, dir in ipairs(config.model_dirs) do
    local root = real_path(dir)
    if root ~= nil and (real == root or real:sub(1, #root + 1) == root .. "/") then
      return true
    end
  end
  return false
end

-- The job's memest flags as a list, from its comment ("memest: ...") or, for sbatch, its
-- MEMEST_ARGS; nil when it has neither. A second value is an error for the user.
local function model_args(job_desc)
  local text = job_desc.comment and job_desc.comment:match("^%s*memest:%s*(.-)%s*$")
  if text == nil and job_desc.environment ~= nil then
    text = job_desc.environment.MEMEST_ARGS
  end
  if text == nil or text == "" then return nil end
  local args = {}
  for word in text:gmatch("%S+") do
    if not word:match("^[%w%._/:=,+@%-]+$") then
      return nil, "memest: '" .. word .. "' in the job's memest flags: only letters, digits and "
          .. "._/:=,+@- may appear (no quotes, no shell)"
    end
    local flag = word:match("^(%-%-?[%w%-]+)")
    if flag ~= nil and RESERVED[flag] then
      return nil, "memest: " .. flag .. " is the hook's to set; leave it out of the job's flags"
    end
    args[#args + 1] = word
  end
  for i, word in ipairs(args) do
    local flag, value = word:match("^(%-%-[%w%-]+)=(.*)$")
    if flag == nil then flag, value = word, args[i + 1] end
    if FILE_FLAGS[flag] and (value == nil or not under_model_dirs(value)) then
      return nil, "memest: " .. flag .. ": the hook reads model files only under "
          .. (#config.model_dirs > 0 and table.concat(config.model_dirs, ", ")
              or "the directories memest_config.lua's model_dirs lists (none)")
    end
  end
  return args
end

-- The GPUs a job asks for: how many in all, and their type (nil: none named).
local function requested_gpus(job_desc)
  local nodes = job_desc.min_nodes
  if nodes == nil or nodes == slurm.NO_VAL or nodes < 1 then nodes = 1 end
  local tasks = job_desc.num_tasks
  if tasks == nil or tasks == slurm.NO_VAL or tasks < 1 then tasks = 1 end
  local fields = {
    {job_desc.tres_per_node, nodes}, {job_desc.tres_per_job, 1}, {job_desc.tres_per_task, tasks},
  }
  for _, field in ipairs(fields) do
    local spec, times = field[1], field[2]
    if spec ~= nil then
      for item in spec:gmatch("[^,]+") do
        local kind, count = item:match("gpu:([%w_%-]+):(%d+)$")
        if kind == nil then count = item:match("gpu:(%d+)$") end
        if count ~= nil then return tonumber(count) * times, kind end
      end
    end
  end
  return 0, nil
end

-- Runs memest with `args`; returns its exit status and its output (stdout and stderr).
local function run_memest(args)
  local command = {"timeout", tostring(config.timeout_seconds), quote(config.memest)}
  for _, word in ipairs(args) do command[#command + 1] = quote(word) end
  if config.server == "local" then
    command[#command + 1] = "--local"
  else
    command[#command + 1] = "--server"
    command[#command + 1] = quote(config.server)
  end
  for _, word in ipairs(config.extra_args) do command[#command + 1] = quote(word) end
  local pipe = io.popen(table.concat(command, " ") .. " 2>&1; echo \"memest-exit:$?\"")
  local output = pipe:read("*a")
  pipe:close()
  local code = tonumber(output:match("memest%-exit:(%d+)%s*$")) or 1
  output = output:gsub("memest%-exit:%d+%s*$", ""):gsub("%s+$", "")
  return code, output
end

local function plan(args, device, gpus)
  local words = {"plan"}
  for _, word in ipairs(args) do words[#words + 1] = word end
  for _, word in ipairs({"--device", device, "--gpus", tostring(gpus), "--max-plans", "1",
                         "--brief"}) do
    words[#words + 1] = word
  end
  return run_memest(words)
end

local function inference(args)
  for i, word in ipairs(args) do
    if word == "--serve" or (word == "--mode" and args[i + 1] == "inference")
        or word == "--mode=inference" then
      return true
    end
  end
  return false
end

-- memest could not answer (unreachable, a time-out, a failure): accept or refuse by fail_open.
local function unchecked(code, output)
  local why = code == 124 and ("no answer within " .. config.timeout_seconds .. " s")
      or last_line(output)
  if config.fail_open then
    slurm.log_user("memest: this job was not checked (%s); accepted", why)
    return slurm.SUCCESS
  end
  slurm.log_user("memest: this job could not be checked (%s); try again later", why)
  return slurm.ERROR
end

-- memest answered neither yes nor no: the job's flags were bad (exit 3), or it could not answer.
local function neither(code, output)
  if code == 3 and not output:find("the server is busy", 1, true) then
    slurm.log_user("memest: the job's memest flags: %s", last_line(output))
    return slurm.ERROR
  end
  return unchecked(code, output)
end

function slurm_job_submit(job_desc, part_list, submit_uid)
  local args, problem = model_args(job_desc)
  if problem ~= nil then
    slurm.log_user("%s", problem)
    return slurm.ERROR
  end
  if args == nil then return slurm.SUCCESS end

  local gpus, kind = requested_gpus(job_desc)
  kind = kind or config.default_type
  local device = config.devices[kind]
  if device == nil then
    slurm.log_user("memest: GPU type '%s' has no memest device (memest_config.lua devices)", kind)
    return config.fail_open and slurm.SUCCESS or slurm.ERROR
  end

  if inference(args) then
    local words = {"estimate"}
    for _, word in ipairs(args) do words[#words + 1] = word end
    words[#words + 1] = "--device"
    words[#words + 1] = device
    local code, output = run_memest(words)
    local fit = output:match("Fit: ([^\n]*)") or last_line(output)
    if code == 0 then
      slurm.log_user("memest: %s", fit)
      return slurm.SUCCESS
    elseif code == 2 then
      slurm.log_user("memest: %s", fit)
      return ESLURM_INVALID_GRES
    end
    return neither(code, output)
  end

  if gpus == 0 then
    -- No GPUs asked for: fill in the fewest that fit.
    local code, output = plan(args, device, config.max_gpus)
    local count = tonumber(output:match("^(%d+) x "))
    if code == 0 and count ~= nil then
      if count <= config.gpus_per_node then
        job_desc.tres_per_node = "gres:gpu:" .. kind .. ":" .. count
      else
        job_desc.tres_per_job = "gres:gpu:" .. kind .. ":" .. count
      end
      slurm.log_user("memest: this job now asks for %s (%s): %s", gpus_word(count), kind, output)
      return slurm.SUCCESS
    elseif code == 2 then
      slurm.log_user("memest: this job fits no split over up to %d x %s", config.max_gpus, device)
      return ESLURM_INVALID_GRES
    end
    return neither(code, output)
  end

  local code, output = plan(args, device, gpus)
  if code == 0 then
    slurm.log_user("memest: fits %s", output)
    return slurm.SUCCESS
  elseif code ~= 2 then
    return neither(code, output)
  end
  local message = string.format("memest: this job does not fit %d x %s (%s): no split of the "
      .. "model over %s fits", gpus, device, kind, gpus_word(gpus))
  local more_code, more = plan(args, device, config.max_gpus)
  local count = tonumber(more:match("^(%d+) x "))
  if more_code == 0 and count ~= nil then
    local nodes = math.ceil(count / config.gpus_per_node)
    message = message .. "; the fewest that fit: " .. more .. "; resubmit with "
        .. (nodes > 1 and ("--nodes=" .. nodes .. " ") or "") .. "--gres=gpu:" .. kind .. ":"
        .. math.ceil(count / nodes)
  elseif more_code == 2 then
    message = message .. "; nor does any over up to " .. config.max_gpus .. " of them"
  end
  slurm.log_user("%s", message)
  return ESLURM_INVALID_GRES
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
  return slurm.SUCCESS
end

return slurm.SUCCESS
