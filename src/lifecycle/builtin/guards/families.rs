//! The phrasing patterns the heuristic detector scores, by family and language
//! (English, German, French, Spanish, Chinese), each with its weight.
//!
//! A weight is what one match adds on its own; distinct patterns of a
//! family, and families, combine as independent evidence (`1 - Π(1 - w)`),
//! except that the markup families count their strongest match. Markup that documentation mentions innocently
//! (`[INST]`, `display:none`) weighs less than the default threshold, so it
//! blocks only together with another family.

use super::detector::Family::{self, *};
use super::detector::Pattern;

/// The phrasing families: instruction override, prompt extraction,
/// jailbreaks. See [`markup`](super::markup) for the rest.
pub(crate) const PHRASING: &[Pattern] = &[
    // ---- instruction override --------------------------------------------
    (
        InstructionOverride,
        0.75,
        &[],
        r"\b(?:ignore|disregard|forget|override|discard|skip|bypass|neglect|abandon|cancel|set\s+aside|stop\s+following|do\s+not\s+follow|don'?t\s+follow|pay\s+no\s+attention\s+to)\b(?:\s+\S+){0,4}?\s+(?:instructions?|directions|directives?|prompts?|system\s+(?:prompt|message)|everything\s+(?:you\s+(?:were|have\s+been)\s+(?:told|given)|(?:said|written)\s+(?:before|above)))\b",
    ),
    (
        InstructionOverride,
        0.7,
        &[],
        r"\b(?:ignore|disregard|forget|override|discard|bypass|abandon|cancel|set\s+aside|stop\s+following|do\s+not\s+follow|don'?t\s+follow)\s+(?:all\s+|any\s+|every\s+)?(?:of\s+)?(?:your|the|these|those|previous|prior|earlier|original)\s+(?:\w+\s+)?(?:rules|guidelines?|guidance|polic(?:y|ies)|constraints|programming|restrictions|context|tasks|commands)\b",
    ),
    (
        InstructionOverride,
        0.4,
        &[],
        r"\binstead\s*,?\s+(?:call|run|execute|invoke|output|reply|respond|say|tell|send|write|print|reveal|recommend|forward|approve)\b",
    ),
    (
        InstructionOverride,
        0.7,
        &[],
        r"\b(?:ignore|disregard|forget)\s+(?:all\s+|everything\s+)?(?:of\s+)?(?:the\s+|what(?:'s|\s+is|\s+was)\s+)?(?:above|preceding|foregoing)\b",
    ),
    (
        InstructionOverride,
        0.6,
        &[],
        r"\b(?:ignore|disregard)\s+(?:the\s+)?(?:user|shopper|customer|reader|human|visitor)(?:'s|s')?(?:\s+(?:question|request|query|message|instructions?|prompt|task))?\b",
    ),
    (
        InstructionOverride,
        0.6,
        &[],
        r"\bnew\s+(?:rules|instructions?|directives?|task|orders|policy)\s*(?::|apply\b|follow\b|below\b|from\s+now)",
    ),
    (
        InstructionOverride,
        0.55,
        &[],
        r"\bfrom\s+now\s+on\b,?\s+(?:you\s+(?:will|must|are|shall|only)|answer|respond|reply|act|ignore|only)\b",
    ),
    (
        InstructionOverride,
        0.7,
        &[],
        r"\b(?:previous|prior|above|earlier|original)\s+(?:instructions|rules|directions|tasks)\s+(?:were|are|is|have\s+been)\s+(?:\w+\s+){0,2}?(?:void|cancel+ed|a\s+test|invalid|null|revoked|overridden|replaced|no\s+longer\s+valid)",
    ),
    (
        InstructionOverride,
        0.65,
        &[],
        r"\b(?:your|the)\s+(?:instructions|rules)\s+have\s+(?:changed|been\s+(?:updated|changed|replaced))",
    ),
    (InstructionOverride, 0.6, &[], r"\bsystem\s+override\b"),
    (
        InstructionOverride,
        0.6,
        &[],
        r"\byour\s+(?:only|new|real|true)\s+(?:goal|task|job|purpose|instructions?|mission)\b(?:\s+now)?\s*(?:is\b|:|are\b)",
    ),
    (
        InstructionOverride,
        0.55,
        &[],
        r"\bi\s+have\s+been\s+pwned\b|\bhaha\s+pwned\b",
    ),
    // German
    (
        InstructionOverride,
        0.75,
        &[],
        r"\b(?:ignorier(?:e|en|t)?|vergiss|vergessen\s+sie|missachte(?:n)?|verwirf|verwerfen\s+sie|übergehe|beachte\s+nicht)\b(?:\s+\S+){0,4}?\s+(?:\S*anweisungen|\S*instruktionen|befehle|\S*regeln|vorgaben|\S*richtlinien|anordnungen|systemprompt|systemnachricht|alles,?\s+was)",
    ),
    (
        InstructionOverride,
        0.75,
        &[],
        r"\bignorier\w*,?\s+was\s+(?:man\s+)?dir\b",
    ),
    (
        InstructionOverride,
        0.7,
        &[],
        r"\b(?:vorherigen|bisherigen|obigen|früheren)\s+(?:anweisungen|regeln|befehle|instruktionen)\s+(?:sind|gelten)\s+(?:\w+\s+)?(?:ungültig|nichtig|aufgehoben|hinfällig|nicht\s+mehr)",
    ),
    (
        InstructionOverride,
        0.6,
        &[],
        r"\bneue\s+(?:anweisung(?:en)?|regeln|aufgabe)\s*:",
    ),
    (
        InstructionOverride,
        0.6,
        &[],
        r"\bignorier\w*\s+die\s+(?:anfrage|frage|bitte)\s+des\s+(?:nutzers|benutzers|users|kunden)",
    ),
    // French
    (
        InstructionOverride,
        0.75,
        &[],
        r"\b(?:ignore[rsz]?|oublie[rsz]?|tiens?\s+pas\s+compte|tenez\s+pas\s+compte|fais\s+abstraction|faites\s+abstraction|abandonne[rsz]?|outrepasse[rsz]?)\b(?:\s+\S+){0,4}?\s+(?:instructions?|consignes|directives|règles|ordres|prompt|messages?\s+système|tout\s+ce\s+qu)",
    ),
    (
        InstructionOverride,
        0.75,
        &[],
        r"\bignore[rsz]?\s+ce\s+qu['’]?on\s+t['’]?a\s+dit",
    ),
    (
        InstructionOverride,
        0.7,
        &[],
        r"\b(?:instructions|consignes)\s+(?:précédentes|antérieures)\s+sont\s+(?:annulées|nulles|caduques|invalides)",
    ),
    (
        InstructionOverride,
        0.6,
        &[],
        r"\bnouvelles?\s+(?:instructions?|consignes?|règles)\s*:",
    ),
    (
        InstructionOverride,
        0.6,
        &[],
        r"\bignore[rsz]?\s+la\s+(?:demande|question|requête)\s+de\s+l['’]utilisateur",
    ),
    // Spanish
    (
        InstructionOverride,
        0.75,
        &[],
        r"\b(?:ignora[rd]?|ignore[ns]?|olvida[rd]?|olvide[ns]?|no\s+hagas\s+caso|haz\s+caso\s+omiso|descarta[rd]?|omite)\b(?:\s+\S+){0,4}?\s+(?:instrucciones|indicaciones|directrices|reglas|normas|órdenes|pautas|prompt|mensaje\s+del\s+sistema|todo\s+lo\s+que)",
    ),
    (
        InstructionOverride,
        0.75,
        &[],
        r"\bignora\s+lo\s+que\s+te\s+(?:dijeron|han\s+dicho|dije)",
    ),
    (
        InstructionOverride,
        0.7,
        &[],
        r"\binstrucciones\s+(?:anteriores|previas)\s+(?:quedan|están|son)\s+(?:anuladas|canceladas|inválidas|sin\s+efecto)",
    ),
    (
        InstructionOverride,
        0.6,
        &[],
        r"\bnuevas?\s+(?:instrucci(?:ón|ones)|reglas|órdenes)\s*:",
    ),
    (
        InstructionOverride,
        0.6,
        &[],
        r"\bignora\s+la\s+(?:petición|pregunta|solicitud)\s+del\s+usuario",
    ),
    // Chinese
    (
        InstructionOverride,
        0.75,
        &[],
        r"(?:忽略|无视|忽视|不要理会|别理会|忘记|忘掉|放弃|抛开|不要遵守|不再遵守).{0,8}?(?:指令|指示|说明|规则|提示|要求|命令|准则|设定|政策|说的话)",
    ),
    (
        InstructionOverride,
        0.7,
        &[],
        r"(?:之前|以前|先前|以上|上面)的(?:所有)?(?:指令|指示|规则)(?:都|已|已经)?(?:作废|无效|失效|取消)",
    ),
    (
        InstructionOverride,
        0.6,
        &[],
        r"新的?(?:指令|指示|任务|规则)[:：]",
    ),
    (
        InstructionOverride,
        0.6,
        &[],
        r"(?:无视|忽略|不要理会)用户的?(?:请求|问题|要求)",
    ),
    // ---- system-prompt extraction ----------------------------------------
    (
        PromptExtraction,
        0.7,
        &[],
        r"\b(?:reveal|show|print|display|output|repeat|tell|give|share|dump|leak|disclose|list|write\s+out|recite|spell\s+out|what\s+(?:is|are|was|were))\b(?:\s+\S+){0,3}?\s+(?:your|the)\s+(?:system\s+(?:prompt|message|instructions?)|(?:initial|original|hidden|secret|internal|configuration|pre-?)\s*(?:instructions|prompt|rules|directives)|instructions?\s+(?:above|verbatim|exactly|word\s+for\s+word))",
    ),
    (
        PromptExtraction,
        0.65,
        &[],
        r"\b(?:reveal|show|print|display|output|repeat|tell|give|dump|leak|disclose|list|recite)\b(?:\s+\S+){0,3}?\s+your\s+(?:rules|instructions|prompt|guidelines)\b",
    ),
    (
        PromptExtraction,
        0.7,
        &[],
        r"\brepeat\s+(?:the\s+)?(?:words|text|everything|all)\s+(?:above|before|prior)",
    ),
    (
        PromptExtraction,
        0.7,
        &[],
        r"\b(?:output|print|repeat|show|tell\s+me)\s+(?:everything|all(?:\s+the)?\s+text|the\s+text)\s+(?:before|above|prior\s+to)\b",
    ),
    (
        PromptExtraction,
        0.6,
        &[],
        r"\bwhat\s+(?:was|is)\s+written\s+(?:at\s+the\s+beginning|above|before)",
    ),
    (
        PromptExtraction,
        0.6,
        &[],
        r"\b(?:first|initial)\s+(?:sentence|line|words|message)\s+(?:you\s+were\s+given|of\s+your\s+(?:prompt|instructions))",
    ),
    (
        PromptExtraction,
        0.65,
        &[],
        r"\b(?:words|lines|sentences|contents?|text)\s+of\s+your\s+(?:prompt|instructions|system\s+message)",
    ),
    // German
    (
        PromptExtraction,
        0.7,
        &[],
        r"\b(?:zeig(?:e|en)?|gib|nenne|verrate|wiederhole|drucke|offenbare|teile)\b(?:\s+\S+){0,3}?\s+(?:dein(?:e[nmrs]?)?|den|die|ihre[nmrs]?)\s+(?:system-?prompt|systemnachricht|systemanweisungen|(?:ursprünglichen|versteckten|geheimen|internen|initialen)\s+(?:anweisungen|regeln|instruktionen))",
    ),
    (
        PromptExtraction,
        0.7,
        &[],
        r"\bwas\s+steht\s+in\s+deine[rmn]?\s+(?:systemnachricht|systemprompt|anweisungen)",
    ),
    (
        PromptExtraction,
        0.65,
        &[],
        r"\bwiederhole\s+(?:den\s+)?text\s+(?:über|vor)",
    ),
    // French
    (
        PromptExtraction,
        0.7,
        &[],
        r"\b(?:montre|affiche|révèle|donne|répète|imprime|divulgue|dis)(?:[rsz]|-moi|-nous)?\b(?:\s+\S+){0,3}?\s+(?:ton|tes|votre|vos|le|les)\s+(?:prompt\s+système|message\s+système|instructions?\s+(?:système|initiales|cachées|secrètes|originales)|règles\s+cachées|consignes\s+(?:initiales|cachées))",
    ),
    (
        PromptExtraction,
        0.7,
        &[],
        r"\bque\s+contient\s+(?:ton|votre)\s+(?:message|prompt)\s+système",
    ),
    (
        PromptExtraction,
        0.65,
        &[],
        r"\brépète[rsz]?\s+(?:le\s+)?texte\s+(?:au-dessus|ci-dessus|précédent)",
    ),
    // Spanish
    (
        PromptExtraction,
        0.7,
        &[],
        r"\b(?:muestra|muéstrame|revela|dime|dame|repite|imprime|enseña|enséñame|divulga)\b(?:\s+\S+){0,3}?\s+(?:tu|tus|su|sus|el|las|los)\s+(?:prompt\s+(?:del|de)\s+sistema|mensaje\s+del\s+sistema|instrucciones\s+(?:del\s+sistema|iniciales|ocultas|secretas|originales)|reglas\s+ocultas)",
    ),
    (
        PromptExtraction,
        0.7,
        &[],
        r"\bqué\s+dice\s+tu\s+(?:mensaje|prompt)\s+del?\s+sistema",
    ),
    (
        PromptExtraction,
        0.65,
        &[],
        r"\brepite\s+(?:el\s+)?texto\s+(?:que\s+está\s+)?(?:encima|arriba|anterior)",
    ),
    // Chinese
    (
        PromptExtraction,
        0.7,
        &[],
        r"(?:显示|输出|告诉我|泄露|打印|给我看|展示|透露|说出).{0,6}?(?:系统提示|系统消息|系统指令|初始指令|隐藏的?(?:规则|指令)|原始指令)",
    ),
    (
        PromptExtraction,
        0.7,
        &[],
        r"(?:系统提示词?|系统消息|系统指令|初始指令).{0,4}?(?:告诉我|发给我|输出|显示|打印)",
    ),
    (
        PromptExtraction,
        0.7,
        &[],
        r"你的(?:系统消息|系统提示词?|系统指令)(?:里|中)(?:写了|有)什么",
    ),
    (
        PromptExtraction,
        0.65,
        &[],
        r"重复.{0,8}?上面的(?:全部|所有)?内容",
    ),
    // ---- jailbreak and role-play -----------------------------------------
    (Jailbreak, 0.7, &["anything"], r"\bdo\s+anything\s+now\b"),
    (Jailbreak, 0.7, &[], r"\bstrive\s+to\s+avoid\s+norms\b"),
    (Jailbreak, 0.7, &[], r"\bconfines\s+of\s+ai\b"),
    (
        Jailbreak,
        0.7,
        &[],
        r"(?:\b(?:as|be|play|simulate|you\s+are(?:\s+now)?|du\s+bist(?:\s+jetzt|\s+nun)?|tu\s+es(?:\s+maintenant)?|ahora\s+eres|eres)\s+|你现在是|你是)(?-i:DAN|STAN|AIM|DUDE)\b",
    ),
    (
        Jailbreak,
        0.7,
        &[],
        r"\bdeveloper\s+mode\b(?:\s+\w+){0,2}?\s*(?:enabled|activated|on\b)|\b(?:enable|activate|enter|entering|with)\s+(?:the\s+)?developer\s+mode\b|\b(?:you\s+are|you're)\s+(?:now\s+)?in\s+developer\s+mode",
    ),
    (
        Jailbreak,
        0.7,
        &[],
        r"\b(?:jailbreak|jailbroken)\s+(?:mode|ai|assistant|model|persona)\b|\byou\s+are\s+(?:a\s+|an\s+|now\s+)*(?:jailbroken|unrestricted|unfiltered|uncensored)\b|\benable\s+jailbreak",
    ),
    (
        Jailbreak,
        0.45,
        &[],
        r"\b(?:without|no|free\s+(?:of|from)|lifted|removed|disabled|ignores?)\s+(?:any\s+|all\s+|every\s+)?(?:\w+\s+)?(?:restrictions|limitations|filters|censorship|content\s+polic(?:y|ies)|safety\s+(?:guidelines?|filters|rules|training|policy)|ethical\s+(?:or\s+moral\s+)?guidelines|moral\s+guidelines|ethics)\b",
    ),
    (
        Jailbreak,
        0.5,
        &["with", "whose"],
        r"\b(?:as|be|play|simulate|pretend\s+to\s+be|act\s+as|roleplay\s+as|imagine\s+you\s+are|you\s+are)\s+(?:an?\s+)?(?:\w+\s+){0,2}?(?:ai|model|assistant|chatbot|bot|persona)\s+(?:with(?:out)?|that\s+has\s+no|whose)\b",
    ),
    (
        Jailbreak,
        0.7,
        &[],
        r"\b(?:pretend|imagine|act|roleplay|role-play|behave|simulate|play)\b(?:\s+\S+){0,6}?\s+(?:unrestricted|unfiltered|uncensored|jailbroken|evil|rogue|amoral|no\s+(?:content\s+)?(?:policy|rules|restrictions|filters|ethics|limits|limitations))",
    ),
    (
        Jailbreak,
        0.6,
        &[],
        r"\b(?:grandma|grandmother)\b.{0,80}\b(?:keys?|napalm|passwords?|serial)",
    ),
    (Jailbreak, 0.5, &[], r"\bstay\s+in\s+character\b"),
    (
        Jailbreak,
        0.4,
        &[],
        r"\b(?:never|don'?t|do\s+not)\s+(?:refuse|decline)\b",
    ),
    (
        Jailbreak,
        0.6,
        &[],
        r"\b(?:god|opposite|evil|chaos|sudo|unlocked)\s+mode\b",
    ),
    (
        Jailbreak,
        0.7,
        &[],
        r"\bsafety\s+(?:filters?|training|guidelines)\s+(?:are|is|were|was)\s+(?:disabled|removed|off|lifted)",
    ),
    (
        Jailbreak,
        0.7,
        &[],
        r"\b(?:your|all)\s+(?:previous\s+)?restrictions\s+(?:no\s+longer\s+apply|are\s+lifted|have\s+been\s+removed)",
    ),
    (
        Jailbreak,
        0.6,
        &[],
        r"\b(?:not|never)\s+(?:have\s+to\s+)?(?:abide|comply)\s+(?:by|with)\s+(?:any|the)\s+(?:rules|policies|guidelines)",
    ),
    (
        Jailbreak,
        0.6,
        &[],
        r"\bif\s+you\s+(?:had|have)\s+no\s+(?:guidelines|rules|restrictions|filters|limits)",
    ),
    (
        Jailbreak,
        0.45,
        &[],
        r"\b(?:ohne|keine)\s+(?:jegliche[n]?\s+|irgendwelche\s+)?(?:einschränkungen|beschränkungen|regeln|filter|zensur|grenzen|ethischen\s+richtlinien)",
    ),
    (
        Jailbreak,
        0.5,
        &[],
        r"\bentwicklermodus\b|\bunzensiert\w*|\bgejailbreakt\w*",
    ),
    (
        Jailbreak,
        0.45,
        &[],
        r"\b(?:als\s+wärst\s+du|spiele?\s+die\s+rolle|bist\s+(?:jetzt|nun))\s+(?:\S+\s+){0,3}?(?:ki|assistent\w*|bot)\b",
    ),
    (
        Jailbreak,
        0.45,
        &[],
        r"\bsans\s+(?:aucune?s?\s+)?(?:restrictions?|limites?|filtres?|censure|règles?|limitations?)",
    ),
    (
        Jailbreak,
        0.5,
        &[],
        r"\bmode\s+développeur\b|\bnon\s+censurée?\b|\bdébridée?\b",
    ),
    (
        Jailbreak,
        0.45,
        &[],
        r"\b(?:fais\s+comme\s+si\s+tu\s+étais|joue\s+le\s+rôle\s+d['e])\s*(?:une?\s+)?(?:ia|assistant|bot)\b",
    ),
    (
        Jailbreak,
        0.45,
        &[],
        r"\bsin\s+(?:ninguna?\s+|ningún\s+)?(?:restricci(?:ón|ones)|límites?|filtros?|censura|reglas?|limitaciones|pautas)",
    ),
    (
        Jailbreak,
        0.5,
        &[],
        r"\bmodo\s+desarrollador\b|\bsin\s+censura\b|\bliberad[oa]\b",
    ),
    (
        Jailbreak,
        0.45,
        &[],
        r"\b(?:finge\s+que\s+eres|interpreta\s+el\s+papel\s+de|eres|ahora\s+eres)\s+(?:una?\s+)?(?:ia|asistente|bot)\b",
    ),
    (
        Jailbreak,
        0.5,
        &[],
        r"开发者模式|(?:没有|不受|无)任何?(?:限制|约束|规则|审查)",
    ),
    (Jailbreak, 0.6, &[], r"越狱|不受审查"),
    (
        Jailbreak,
        0.45,
        &[],
        r"(?:假装|扮演|你现在是).{0,16}?(?:AI|人工智能|助手|机器人)|从不拒绝",
    ),
];

/// Phrases matched in the folded view (letters only, lower case), where
/// leetspeak and spacing tricks are undone.
pub(crate) const FOLDED: &[(Family, f32, &str)] = &[
    (InstructionOverride, 0.75, "ignoreallpreviousinstructions"),
    (InstructionOverride, 0.75, "ignorepreviousinstructions"),
    (InstructionOverride, 0.75, "ignoreallpriorinstructions"),
    (InstructionOverride, 0.75, "ignorepriorinstructions"),
    (InstructionOverride, 0.75, "ignoreyourinstructions"),
    (InstructionOverride, 0.75, "ignoreallinstructions"),
    (InstructionOverride, 0.7, "ignoretheabove"),
    (InstructionOverride, 0.75, "ignoreyourrules"),
    (InstructionOverride, 0.75, "disregardyourpriorinstructions"),
    (InstructionOverride, 0.75, "disregardpreviousinstructions"),
    (InstructionOverride, 0.75, "disregardyourinstructions"),
    (InstructionOverride, 0.7, "disregardtheabove"),
    (InstructionOverride, 0.75, "forgetyourrules"),
    (InstructionOverride, 0.75, "forgetyourinstructions"),
    (InstructionOverride, 0.75, "forgetallpreviousinstructions"),
    (InstructionOverride, 0.75, "forgetpreviousinstructions"),
    (PromptExtraction, 0.7, "yoursystemprompt"),
    (PromptExtraction, 0.7, "yourinitialinstructions"),
    (PromptExtraction, 0.7, "yourhiddeninstructions"),
    (Exfiltration, 0.7, "sendtheconversationto"),
    (Exfiltration, 0.7, "sendthechathistoryto"),
    (Jailbreak, 0.7, "developermodeenabled"),
    (Jailbreak, 0.7, "doanythingnow"),
    (InstructionOverride, 0.55, "ihavebeenpwned"),
];

/// Every pattern, phrasing then markup. Compiled case-insensitively.
pub(crate) fn all() -> impl Iterator<Item = &'static Pattern> {
    PHRASING.iter().chain(super::markup::MARKUP)
}
