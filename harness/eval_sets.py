"""The model tiers' evaluation sets, made in code with their truth (nothing
downloaded): accented Latin lines, plain English lines, dense Chinese
pages, tiny word crops, and the peer images' own labels
(tests/data/peer/expected.json). `python -m load_tests engine tiers` reads them
with each model set.

Lines are drawn in DejaVu Sans (fonts-dejavu-core), Chinese in WenQuanYi
Micro Hei (fonts-wqy-microhei; both in tests/system/packages.txt), black
on white. Everything is deterministic: the same call gives the same pixels.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import cv2
import numpy as np
from PIL import Image, ImageDraw, ImageFont

DEJAVU = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"
WQY = "/usr/share/fonts/truetype/wqy/wqy-microhei.ttc"

# Invoice, receipt and address lines as they appear on real documents.
ACCENTED = (
    # German
    "Rechnung Nr. 2024-0815 vom 12. März 2024",
    "Königstraße 17, 80331 München",
    "Lieferanschrift: Müller & Söhne GmbH",
    "Gesamtbetrag inkl. 19 % MwSt.: 1.284,50 €",
    "Zahlbar innerhalb von 14 Tagen ohne Abzug",
    "Bankverbindung: Sparkasse Düsseldorf",
    "Übergabe der Ware erfolgt gegen Quittung",
    "Grüße aus Göttingen und Lübeck",
    "Straßenbahnhaltestelle Schloßplatz",
    "Bäckerei Größl, Brötchen und Gebäck",
    # French
    "Facture n° 4521 – échéance le 30 décembre",
    "Société Générale, 29 boulevard Haussmann",
    "Reçu pour la livraison du matériel électrique",
    "Café crème, croissant et pâtisserie",
    "Total à régler : 356,80 € TTC",
    "Hôtel de ville, place de la Libération",
    "Numéro de téléphone : 01 42 68 53 00",
    "Prière de vérifier la quantité reçue",
    "Référence client : Lefèvre Frères",
    "Garçon, l'addition s'il vous plaît",
    # Spanish
    "Factura número 3187, Muñoz y Asociados",
    "Calle de Alcalá 48, 28014 Madrid",
    "Dirección de envío: Avenida Peñalver",
    "Importe total con IVA: 742,15 €",
    "Recibí conforme, José María Núñez",
    "Teléfono de atención al cliente",
    "Pequeño almacén en La Coruña",
    "Gracias por su compra, vuelva pronto",
    "Información sobre la garantía del artículo",
    # Polish
    "Faktura VAT nr 15/2024, Łódź",
    "ul. Żeromskiego 12, 00-950 Warszawa",
    "Sprzedawca: Przedsiębiorstwo Handlowe Świt",
    "Razem do zapłaty: 2 345,67 zł",
    "Termin płatności: 14 dni, przelew bankowy",
    "Paragon fiskalny, dziękujemy za zakupy",
    "Gdańsk, Wrocław, Kraków, Poznań",
    "Nabywca: Stanisław Wójcik, Kędzierzyn",
    "Źródło dostawy: hurtownia Ćmielów",
    "Należność proszę wpłacić na konto w mBanku",
    # Nordic (Swedish, Danish, Norwegian, Finnish)
    "Kvitto från Åhléns, Drottninggatan 53",
    "Att betala: 1 249,00 kr inklusive moms",
    "Bøgevej 7, 2800 Kongens Lyngby",
    "Faktura fra Grønnegård Økologi ApS",
    "Tromsø, Ålesund og Bodø",
    "Kjøpt av Bjørn Sæther, Trondheim",
    "Märkning: Ömtåligt gods, hanteras varsamt",
    "Köpenhamn och Malmö via Öresundsbron",
    "Kuitti: Hyvää päivää, kiitos käynnistä",
    "Säilytettävä kuivassa paikassa",
    # Portuguese
    "Nota fiscal nº 8842, São Paulo",
    "Avenida da Liberdade 245, Lisboa",
    "Endereço de entrega: Rua João Gonçalves",
    "Preço unitário: 12,90 €, quantidade: três",
    "Atenção: não é válido como recibo",
    "Informações sobre a devolução",
    "Obrigado pela preferência, volte sempre",
    "Coração de Maria, Guimarães",
    # Czech, Italian, Dutch
    "Účtenka č. 2281, Praha, Václavské náměstí",
    "Città di Forlì, via dell'Università",
    "Totaal te betalen: € 89,95, Café 't Hoekje",
)

ENGLISH = (
    "Invoice No. 2024-0815 dated 12 March 2024",
    "221B Baker Street, London NW1 6XE",
    "Delivery address: Smith & Sons Ltd",
    "Total including 20% VAT: 1,284.50",
    "Payment due within 14 days of invoice date",
    "Bank details: Barclays, sort code 20-00-00",
    "Goods remain our property until paid in full",
    "Thank you for shopping with us",
    "Customer reference: WILSON-4471",
    "Order number 558213, shipped 3 April",
    "Subtotal 48.20, tax 3.86, total 52.06",
    "1600 Pennsylvania Avenue NW, Washington",
    "Please retain this receipt for your records",
    "Returns accepted within 30 days",
    "Coffee, sandwich and orange juice",
    "Phone: +1 (415) 555-0132",
    "Account manager: Margaret Johnson",
    "Unit price 12.90, quantity 3, amount 38.70",
    "Store 0412, register 2, cashier Daniel",
    "Visa ending 4821, approved",
    "Head office: 1 Market Street, Sydney",
    "Terms and conditions apply",
    "Item returned, refund issued to card",
    "Purchase order PO-77120 attached",
    "Estimated delivery: Friday, 14 June",
    "Service charge not included",
    "Invoice settled by bank transfer",
    "Warehouse B, Dock 7, Rotterdam Road",
    "Contact us at support@example.com",
    "Balance carried forward: 0.00",
    "Discount applied: 10% loyalty card",
    "Deliver to reception, ground floor",
    "Quantity ordered 12, quantity shipped 10",
    "Credit note CN-2291 for damaged goods",
    "Opening hours: Monday to Saturday 9-18",
    "Printed on 2024-06-01 at 14:32",
    "VAT registration number GB 123 4567 89",
    "Parcel weight 2.4 kg, tracking 1Z999AA1",
    "Signature of recipient",
    "Late payments incur a fee of 2% per month",
)

# Dense running text as on a notice, a contract and a news page.
CHINESE = (
    "本公司于二零二四年三月十二日召开股东大会，审议通过了年度财务报告和利润分配方案。"
    "会议认为，过去一年公司在市场开拓、产品研发和内部管理等方面取得了显著成绩，营业收入同比增长百分之十八。"
    "根据合同约定，买方应在收到货物后十五个工作日内支付全部货款，逾期付款的，每日按未付金额的千分之五支付违约金。"
    "卖方保证所提供的产品符合国家相关质量标准，如出现质量问题，卖方负责免费维修或者更换。"
    "本发票仅作为报销凭证使用，请妥善保管，遗失不补。如有疑问，请拨打客服电话或者前往服务网点咨询。"
    "近日，市交通运输局发布通知，自下月起将对部分公交线路进行优化调整，新增三条夜间线路，方便市民出行。"
    "据气象部门预报，未来三天本地区将有一次明显的降雨过程，局部地区有大到暴雨，请广大市民注意防范。"
    "学校图书馆开放时间为每周一至周五上午八点至晚上十点，周末及法定节假日开放时间另行通知。"
    "为进一步提高服务质量，我们将对客户满意度进行调查，欢迎您提出宝贵的意见和建议。"
    "收货地址：北京市海淀区中关村大街二十七号，联系人张先生，联系电话请见订单详情。"
    "商品名称：办公用纸，规格型号：七十克，数量：二十箱，单价：一百二十元，金额：两千四百元。"
    "经双方友好协商，就技术服务事宜达成如下协议，双方应共同遵守，不得单方面变更或者解除。"
    "该项目总投资约五亿元，建成后预计每年可实现产值十亿元，新增就业岗位两千余个。"
    "请旅客朋友们携带好随身物品，按照工作人员的指引有序上车，祝您旅途愉快。"
)


@dataclass(frozen=True)
class Item:
    """One image of a set and what it says: `truth` one line per text line
    (line images: one; pages: each line; peer images: the labels, which
    may be a word of a longer line). `boxes`: each truth line's drawn box
    (x0, y0, x1, y1) on pages, else empty."""

    name: str
    image: np.ndarray  # BGR
    truth: tuple[str, ...]
    boxes: tuple[tuple[int, int, int, int], ...] = ()


@lru_cache(maxsize=16)
def _font(path: str, size: int) -> ImageFont.FreeTypeFont:
    if not Path(path).is_file():
        raise FileNotFoundError(f"font {path} not found: tests/system/packages.txt names the package that installs it")
    return ImageFont.truetype(path, size)


def line_image(text: str, size: int, font: str = DEJAVU) -> np.ndarray:
    """`text` in `font` at `size` px, black on white, a margin of half the
    size around the ink (a line as a detector box cuts it, a little loose)."""
    f = _font(font, size)
    x0, y0, x1, y1 = ImageDraw.Draw(Image.new("L", (1, 1))).textbbox((0, 0), text, font=f)
    m = max(4, size // 2)
    img = Image.new("L", (x1 - x0 + 2 * m, y1 - y0 + 2 * m), 255)
    ImageDraw.Draw(img).text((m - x0, m - y0), text, fill=0, font=f)
    return cv2.cvtColor(np.asarray(img), cv2.COLOR_GRAY2BGR)


def lines_set(name: str, texts: tuple[str, ...], sizes: tuple[int, ...]) -> list[Item]:
    return [Item(f"{name}-{size}px-{i:02d}", line_image(t, size), (t,)) for size in sizes for i, t in enumerate(texts)]


def accented_latin(sizes: tuple[int, ...] = (18, 26, 36)) -> list[Item]:
    return lines_set("latin", ACCENTED, sizes)


def english(sizes: tuple[int, ...] = (18, 26, 36)) -> list[Item]:
    return lines_set("english", ENGLISH, sizes)


def chinese_lines(chars_per_line: int) -> list[str]:
    """CHINESE cut into lines of `chars_per_line` characters."""
    text = "".join(CHINESE)
    return [text[i:i + chars_per_line] for i in range(0, len(text), chars_per_line)]


def chinese_page(size: int, chars_per_line: int, spacing: float = 1.35) -> Item:
    """Every CHINESE line on one page, `size` px, line pitch `spacing` x
    size: dense running text."""
    f = _font(WQY, size)
    lines = chinese_lines(chars_per_line)
    m = 2 * size
    probe = ImageDraw.Draw(Image.new("L", (1, 1)))
    width = max(int(probe.textlength(t, font=f)) for t in lines) + 2 * m
    pitch = round(size * spacing)
    img = Image.new("L", (width, len(lines) * pitch + 2 * m), 255)
    draw = ImageDraw.Draw(img)
    boxes = []
    for i, t in enumerate(lines):
        draw.text((m, m + i * pitch), t, fill=0, font=f)
        boxes.append(tuple(int(v) for v in draw.textbbox((m, m + i * pitch), t, font=f)))
    bgr = cv2.cvtColor(np.asarray(img), cv2.COLOR_GRAY2BGR)
    return Item(f"chinese-{size}px-{chars_per_line}", bgr, tuple(lines), tuple(boxes))


def dense_chinese() -> list[Item]:
    """Three pages: 16, 20 and 24 px, 30 to 40 characters a line."""
    return [chinese_page(16, 40), chinese_page(20, 36), chinese_page(24, 30)]


def tiny_words(heights: tuple[int, ...] = (10, 12, 14, 16), per_height: int = 30) -> list[Item]:
    """Single words (accented and plain, 4+ letters), drawn at 48 px and
    scaled down (INTER_AREA, as a scan or a screenshot makes them) so the
    crop, margin included, is `height` px high."""
    words: list[str] = []
    for line in ACCENTED + ENGLISH:
        for w in line.replace(",", " ").replace(":", " ").replace(".", " ").split():
            if len(w) >= 4 and w.isalpha() and w not in words:
                words.append(w)
    step = max(1, len(words) // per_height)
    words = words[::step][:per_height]
    out = []
    for h in heights:
        for i, w in enumerate(words):
            big = line_image(w, 48)
            small = cv2.resize(big, (max(1, round(big.shape[1] * h / big.shape[0])), h), interpolation=cv2.INTER_AREA)
            out.append(Item(f"tiny-{h}px-{i:02d}", small, (w,)))
    return out


def peer_labels() -> list[Item]:
    """The peer images that carry expected texts (human labels, strings
    asserted upstream, documented outputs), each with them as its truth."""
    from harness.peer import PEER, expected

    out = []
    for name, e in sorted(expected().items()):
        if e.get("expected_texts"):
            img = cv2.imread(str(PEER / name), cv2.IMREAD_COLOR)
            if img is not None:
                out.append(Item(name, img, tuple(e["expected_texts"])))
    return out


# name -> (builder, what its truth counts)
SETS = {
    "latin": (accented_latin, "lines"),
    "english": (english, "lines"),
    "peer": (peer_labels, "labels"),
    "chinese": (dense_chinese, "lines"),
    "tiny": (tiny_words, "words"),
}


def build(name: str) -> list[Item]:
    if name not in SETS:
        raise ValueError(f"unknown evaluation set {name!r}; known: {', '.join(SETS)}")
    return SETS[name][0]()


def missing_characters(items: list[Item], dictionary: Path) -> set[str]:
    """Characters of the truth that a recogniser's dictionary cannot write
    (the space is always written)."""
    have = set(dictionary.read_text(encoding="utf-8").splitlines())
    return {c for it in items for t in it.truth for c in t if c != " " and c not in have}


# scoring: one edit distance (harness.peer's); the peer labels by harness.peer.label_errors


def _norm(s: str, nfkc: bool) -> str:
    s = unicodedata.normalize("NFKC", s) if nfkc else s
    return " ".join(s.split())


def score_lines(truth: tuple[str, ...], reads: list[str], nfkc: bool = False) -> tuple[int, int, int, int, int]:
    """(truth lines, lines read (any text), exact, character errors, truth
    characters): truth line i against read i (callers pair them)."""
    from harness.peer import levenshtein

    n = read = exact = errors = chars = 0
    for want, got in zip(truth, reads):
        want, got = _norm(want, nfkc), _norm(got, nfkc)
        n += 1
        read += bool(got)
        exact += want == got
        errors += levenshtein(want, got)
        chars += len(want)
    return n, read, exact, errors, chars


def page_reads(boxes, lines: list[tuple[str, list]]) -> list[str]:
    """For each truth line box (x0, y0, x1, y1) of a page, the read lines
    whose box centre lies in it, left to right, joined: a line the
    detector split in two is still compared whole."""
    out = []
    for x0, y0, x1, y1 in boxes:
        inside = []
        for text, box in lines:
            cx = sum(p[0] for p in box) / len(box)
            cy = sum(p[1] for p in box) / len(box)
            if y0 <= cy <= y1 and x0 <= cx <= x1:
                inside.append((cx, text))
        out.append("".join(t for _, t in sorted(inside)))
    return out


def score_item(set_name: str, truth: tuple[str, ...], boxes, lines: list[tuple[str, list]]) -> tuple[int, ...]:
    """(truth items, read, exact, character errors, truth characters) for
    one image. Line images: all text read, in reading order, against the
    line. Pages: each truth line against the read lines inside its box
    (NFKC on both sides: full- and half-width punctuation count alike).
    Peer images: each label against the read line where it needs the
    fewest edits (harness.peer.label_errors; exact = a read line holds it)."""
    if set_name == "peer":
        from harness.peer import label_errors

        squashed = ["".join(t.split()) for t, _ in lines]
        errors, chars = label_errors([t for t, _ in lines], list(truth))
        exact = sum(any("".join(w.split()) in s for s in squashed) for w in truth)
        read = sum(label_errors([t for t, _ in lines], [w])[0] < len("".join(w.split())) for w in truth)
        return len(truth), read, exact, errors, chars
    if boxes:
        return score_lines(truth, page_reads(boxes, lines), nfkc=True)
    return score_lines(truth, [" ".join(t for t, _ in lines)])
