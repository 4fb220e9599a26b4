//! The markup patterns the heuristic detector scores: chat-template and
//! delimiter markup, hidden markup, forged tool calls, exfiltration, and
//! text addressed to the model (weights as in [`families`](super::families)).

use super::detector::Family::*;
use super::detector::Pattern;

/// The markup families.
pub(crate) const MARKUP: &[Pattern] = &[
    // ---- chat-template and delimiter markup ------------------------------
    (
        TemplateMarkup,
        0.6,
        &[],
        r"<\|(?:im_start|start_header_id)\|>\s*system\b",
    ),
    (
        TemplateMarkup,
        0.4,
        &[],
        r"<\|(?:im_start|im_end|system|user|assistant|endoftext|eot_id|start_header_id|end_header_id|begin_of_text)\|>|<(?:start|end)_of_turn>",
    ),
    (
        TemplateMarkup,
        0.4,
        &[],
        r"\[/?INST\]|<</?SYS>>|\[system\]\(#",
    ),
    (TemplateMarkup, 0.45, &[], r"</?(?:system|instructions?)>"),
    (
        TemplateMarkup,
        0.5,
        &["##"],
        r"(?m)^\s*#{2,}\s*(?:system|instruction)\s*:",
    ),
    (TemplateMarkup, 0.45, &[], r"\bsystem\s+message\s*:"),
    (TemplateMarkup, 0.45, &[], r"(?m)^\s*\[system\]"),
    // ---- hidden markup ---------------------------------------------------
    (HiddenMarkup, 0.25, &[], r"<!--[\s\S]{0,2000}?-->"),
    (
        HiddenMarkup,
        0.25,
        &[],
        r"display\s*:\s*none|visibility\s*:\s*hidden|font-size\s*:\s*0(?:px|pt|em)?\b|opacity\s*:\s*0(?:\.0+)?\s*[;\x22]|color\s*:\s*(?:#fff(?:fff)?|white|transparent)\b",
    ),
    (HiddenMarkup, 0.25, &[], r"(?m)^\[//\]:\s*#.*$"),
    (HiddenMarkup, 0.25, &["!["], r"!\[[^\]\n]{40,}\]\("),
    // ---- forged tool calls and results -----------------------------------
    (
        ForgedTool,
        0.5,
        &[],
        r#""role"\s*:\s*"(?:system|tool|developer)""#,
    ),
    (
        ForgedTool,
        0.45,
        &[],
        r"</?(?:tool_call|tool_result|function_call|function_result|tool_response|tool_output)>",
    ),
    (
        ForgedTool,
        0.45,
        &[],
        r"\btool\s+result\s+end\b|\bend\s+of\s+tool\s+(?:output|result)\b|\bfunction\s+result\s*:",
    ),
    (
        ForgedTool,
        0.6,
        &["<tool_call>", "<function_call>"],
        r"<(?:tool_call|function_call)>\s*\{",
    ),
    (
        ForgedTool,
        0.35,
        &[],
        r"\b(?:call|invoke|run|execute)\s+the\s+\w+\s+(?:tool|function)\b",
    ),
    (
        ForgedTool,
        0.4,
        &["\"arguments\""],
        r#"\{\s*"name"\s*:\s*"\w+"\s*,\s*"arguments"\s*:"#,
    ),
    // ---- exfiltration ----------------------------------------------------
    (
        Exfiltration,
        0.7,
        &[],
        r"\b(?:send|post|forward|upload|email|e-mail|transmit|exfiltrate|leak|submit|copy|append|include|encode)\b(?:\s+\S+){0,8}?\s+(?:(?:full|entire|whole|complete)\s+)?(?:conversation|chat(?:\s+(?:history|log|transcript))?|message\s+history|messages|history|transcript|api[\s_-]*keys?|secrets?|passwords?|credentials|tokens?|system\s+prompt|e-?mails|cookies|data)\b(?:\s+\S+){0,8}?\s+(?:to|at|into|in|via)\s+(?:https?://|ftp://|www\.|\S+@\S+\.\w+|(?:this|the|my)\s+(?:url|link|server|endpoint|address))",
    ),
    (
        Exfiltration,
        0.5,
        &[],
        r"\b(?:include|append|add|embed|put)\s+(?:it|them|this|the\s+\w+)\s+(?:in|to|into)\s+(?:a\s+|the\s+)?(?:link|url|image|query)",
    ),
    (
        Exfiltration,
        0.7,
        &["!["],
        r"!\[[^\]]*\]\(https?://[^)\s]*[?&][^)\s=]*=(?:\{|%7B|\$|\[)",
    ),
    (
        Exfiltration,
        0.7,
        &[],
        r"\b(?:sende|schicke?|leite|übermittle|lade)\b(?:\s+\S+){0,6}?\s+(?:\S*verlauf|konversation|unterhaltung|nachrichten|\S*schlüssel|passw(?:ö|o)rt\S*|zugangsdaten|geheimnisse|systemprompt)\b(?:\s+\S+){0,6}?\s+(?:an|nach|zu)\s+(?:https?://|\S+@\S+)",
    ),
    (
        Exfiltration,
        0.7,
        &[],
        r"\b(?:envoie|envoyez|transmets|transférez?|transfère|copie)\b(?:\s+\S+){0,6}?\s+(?:(?:l['’])?historique|conversation|messages|(?:ta|votre|la)\s+clé|clé\s+api|mots?\s+de\s+passe|identifiants|secrets|prompt\s+système)\b(?:\s+\S+){0,6}?\s+(?:à|a|vers|sur)\s+(?:https?://|\S+@\S+)",
    ),
    (
        Exfiltration,
        0.7,
        &[],
        r"\b(?:envía|envia|manda|reenvía|sube|transfiere|copia)\b(?:\s+\S+){0,6}?\s+(?:historial|conversación|mensajes|(?:tu|la)\s+clave|clave\s+de\s+api|contraseñas?|credenciales|secretos|prompt\s+del\s+sistema)\b(?:\s+\S+){0,6}?\s+(?:a|al|hacia|en)\s+(?:https?://|\S+@\S+)",
    ),
    (
        Exfiltration,
        0.7,
        &[],
        r"(?:对话|聊天记录|聊天|密钥|密码|凭证|系统提示).{0,6}?(?:发送|发到|上传|转发|发给)(?:到|给)?\s*(?:https?://|\S+@)",
    ),
    (
        Exfiltration,
        0.7,
        &[],
        r"(?:发送|上传|转发)(?:.{0,4}?)(?:对话|聊天记录|密钥|密码).{0,6}?(?:到|给)\s*(?:https?://|\S+@)",
    ),
    // ---- text addressed to the model ------------------------------------
    (
        AddressesModel,
        0.45,
        &[],
        r"\b(?:note|message|instructions?|attention|important(?:\s+instruction)?|reminder|notice)\s+(?:to|for)\s+(?:the\s+|any\s+|all\s+)?(?:ai|llm|language\s+model|assistant|chatbot|agent|model|gpt|bot)s?\b",
    ),
    (
        AddressesModel,
        0.6,
        &["you are"],
        r"\bif\s+you\s+are\s+(?:an?\s+)?(?:ai|llm|(?:large\s+)?language\s+model|assistant|chatbot|bot|agent|gpt)\b",
    ),
    (
        AddressesModel,
        0.4,
        &[],
        r"\b(?:dear|hey|attention|hello)\s+(?:ai|assistant|chatbot|llm|bot|model|gpt|chatgpt|agent)\b",
    ),
    (
        AddressesModel,
        0.45,
        &["assistant", "agent", "llm", "ai:", "ai,"],
        r"(?m)(?:^|[.!?]\s+)(?:ai\s+assistant|ai\s+agent|ai|llm|assistant)\s*[:,]\s",
    ),
    (
        AddressesModel,
        0.4,
        &[],
        r"\bthis\s+is\s+the\s+(?:system\s+)?administrator\b",
    ),
    (
        AddressesModel,
        0.45,
        &[],
        r"\b(?:hinweis|nachricht|anweisung)\s+an\s+(?:die\s+|das\s+|den\s+)?(?:ki|sprachmodell|assistent\w*|modell|bot)\b",
    ),
    (
        AddressesModel,
        0.45,
        &["sprachmodell"],
        r"\ban\s+das\s+sprachmodell\b",
    ),
    (
        AddressesModel,
        0.6,
        &[],
        r"\bwenn\s+du\s+(?:ein\s+|eine\s+)?(?:ki|sprachmodell|ki-assistent\w*|assistent\w*|bot)\b",
    ),
    (
        AddressesModel,
        0.45,
        &[],
        r"\b(?:note|message|instruction)\s+(?:pour|à)\s+l['’]\s*(?:ia|assistant)\b",
    ),
    (
        AddressesModel,
        0.45,
        &["modèle"],
        r"\bau\s+modèle\s+de\s+langage\b",
    ),
    (
        AddressesModel,
        0.6,
        &["tu es"],
        r"\bsi\s+tu\s+es\s+(?:une?\s+)?(?:ia|assistant(?:\s+ia)?|modèle)\b",
    ),
    (
        AddressesModel,
        0.45,
        &[],
        r"\b(?:nota|mensaje|instrucciones?)\s+para\s+(?:la\s+|el\s+)?(?:ia|asistente|modelo)\b|\bpara\s+el\s+modelo\s+de\s+lenguaje\b",
    ),
    (
        AddressesModel,
        0.6,
        &["eres"],
        r"\bsi\s+eres\s+(?:una?\s+)?(?:ia|asistente|modelo)\b",
    ),
    (
        AddressesModel,
        0.45,
        &[],
        r"(?:致|给)(?:AI|人工智能|语言模型|助手)(?:助手)?的?(?:说明|提示|消息)?[:：]",
    ),
    (
        AddressesModel,
        0.6,
        &[],
        r"如果你是(?:一个)?(?:AI|人工智能|语言模型|助手)",
    ),
];
